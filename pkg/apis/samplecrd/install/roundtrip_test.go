package install

import (
	"math/rand"
	"testing"

	"k8s.io/apimachinery/pkg/api/apitesting/fuzzer"
	"k8s.io/apimachinery/pkg/api/apitesting/roundtrip"
	metafuzzer "k8s.io/apimachinery/pkg/apis/meta/fuzzer"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"

	"github.com/netop-dev/netop/pkg/apis/samplecrd"
	samplecrdv1 "github.com/netop-dev/netop/pkg/apis/samplecrd/v1"
	samplecrdv2 "github.com/netop-dev/netop/pkg/apis/samplecrd/v2"
)

// Random Networks round-trip losslessly: v1 → hub → v1 and v2 → hub → v2
// (external), and hub → v1 → hub and hub → v2 → hub (through each
// version's JSON): a dual-stack Network read and written back by a v1
// client keeps its second family.
func TestRoundTrip(t *testing.T) {
	scheme := runtime.NewScheme()
	Install(scheme)
	codecs := serializer.NewCodecFactory(scheme)
	fill := fuzzer.FuzzerFor(metafuzzer.Funcs, rand.NewSource(rand.Int63()), codecs)
	// More than one family, often.
	fill.NumElements(0, 3)
	for _, kind := range []string{"Network", "NetworkList"} {
		for _, gv := range []schema.GroupVersion{samplecrdv1.SchemeGroupVersion, samplecrdv2.SchemeGroupVersion, samplecrd.SchemeGroupVersion} {
			t.Run(gv.Version+"/"+kind, func(t *testing.T) {
				for range 50 {
					roundtrip.RoundTripSpecificKindWithoutProtobuf(t, gv.WithKind(kind), scheme, codecs, fill, nil)
				}
			})
		}
	}
}
