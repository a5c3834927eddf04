package webhook

import (
	"errors"
	"fmt"
	"reflect"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
)

// Decoder decodes admitted objects by the apiVersion and kind they carry,
// through a scheme, into the type a handler works with. An object of
// another version of the same kind is converted when the scheme has
// conversions for it (a hub), so that a new API version needs no change in
// the handlers; without them it is refused with a message. (The webhooks
// also ask the API server for the version their handlers read.)
type Decoder struct {
	scheme       *runtime.Scheme
	deserializer runtime.Decoder
}

// NewDecoder returns a decoder of the types registered in scheme.
func NewDecoder(scheme *runtime.Scheme) *Decoder {
	return &Decoder{scheme: scheme, deserializer: serializer.NewCodecFactory(scheme).UniversalDeserializer()}
}

// Decode decodes raw into into.
func (d *Decoder) Decode(raw runtime.RawExtension, into runtime.Object) error {
	if len(raw.Raw) == 0 {
		return fmt.Errorf("no object to decode into %T", into)
	}
	// No default kind and no target: an object that does not say what it
	// is, is refused rather than guessed.
	obj, gvk, err := d.deserializer.Decode(raw.Raw, nil, nil)
	if err != nil {
		return err
	}
	if out, in := reflect.ValueOf(into), reflect.ValueOf(obj); out.Type() == in.Type() {
		out.Elem().Set(in.Elem())
		return nil
	}
	// The object is of another type than into: another version of the
	// kind, which the scheme converts, or a kind the handler cannot take.
	if err := d.Convert(obj, into); err != nil {
		return fmt.Errorf("%s cannot be read as %s: %w", gvk, reflect.TypeOf(into).Elem().Name(), err)
	}
	return nil
}

// Convert converts in to out, another version of its kind, through the
// kind's hub when the scheme has one (ConvertThroughHub), directly when it
// has none.
func (d *Decoder) Convert(in, out runtime.Object) error {
	err := ConvertThroughHub(d.scheme, in, out)
	if errors.Is(err, ErrNoHub) {
		return d.scheme.Convert(in, out, nil)
	}
	return err
}

// ErrNoHub says the scheme has no hub (internal version) of a kind.
var ErrNoHub = errors.New("no hub")

// ConvertThroughHub converts in to out, another version of its kind,
// through the kind's hub (the scheme's internal version), as the API
// server converts: versions convert to and from the hub only, never to
// each other.
func ConvertThroughHub(scheme *runtime.Scheme, in, out runtime.Object) error {
	from, _, err := scheme.ObjectKinds(in)
	if err != nil {
		return err
	}
	to, _, err := scheme.ObjectKinds(out)
	if err != nil {
		return err
	}
	hub, err := scheme.New(from[0].GroupKind().WithVersion(runtime.APIVersionInternal))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNoHub, err)
	}
	if err := scheme.Convert(in, hub, nil); err != nil {
		return fmt.Errorf("%s to the hub: %w", from[0].GroupVersion(), err)
	}
	if err := scheme.Convert(hub, out, nil); err != nil {
		return fmt.Errorf("the hub to %s: %w", to[0].GroupVersion(), err)
	}
	return nil
}
