// Package conversion serves a CustomResourceDefinition's conversion
// webhook: the API server POSTs apiextensions.k8s.io/v1 ConversionReviews,
// objects of one version to be returned in another. Every object goes
// through its group's hub (the scheme's internal version), never from
// version to version, so that each version needs two conversions only.
// The conversions are the scheme's (conversion-gen's and the hand-written
// ones beside the types); this package knows no kind.
package conversion

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/netop-dev/netop/internal/webhook"
)

// Converter converts objects between the versions of the groups of a
// scheme that registers their hub (internal) types and conversions.
type Converter struct {
	Scheme *runtime.Scheme
}

// Handler serves ConversionReviews; mount it with webhook.Server.HandleHTTP.
func (c Converter) Handler(ctx context.Context) http.Handler {
	logger := klog.FromContext(ctx)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, status, err := webhook.ReadBody(w, r)
		if err != nil {
			http.Error(w, err.Error(), status)
			return
		}
		// Unmarshalled straight into the fields a conversion reads: JSON
		// scanning is most of its cost, and this scans the body twice (a
		// validation pass and the decoding, which skips the managed fields
		// and the rest of the metadata without copying them).
		review := &reviewIn{}
		if err := json.Unmarshal(body, review); err != nil {
			http.Error(w, fmt.Sprintf("decoding ConversionReview: %v", err), http.StatusBadRequest)
			return
		}
		if review.Request == nil {
			http.Error(w, "a ConversionReview without a request", http.StatusBadRequest)
			return
		}
		resp := c.review(review.Request.UID, review.Request.DesiredAPIVersion, review.Request.Objects)
		out := apiextensionsv1.ConversionReview{TypeMeta: review.TypeMeta, Response: resp}
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(&out); err != nil {
			logger.Error(err, "Writing conversion response")
		}
		if resp.Result.Status != metav1.StatusSuccess {
			logger.Info("Refused a conversion", "uid", review.Request.UID, "to", review.Request.DesiredAPIVersion, "reason", resp.Result.Message)
		}
	})
}

// reviewIn is a ConversionReview as the handler reads it.
type reviewIn struct {
	metav1.TypeMeta `json:",inline"`
	Request         *struct {
		UID               types.UID `json:"uid"`
		DesiredAPIVersion string    `json:"desiredAPIVersion"`
		Objects           []object  `json:"objects"`
	} `json:"request"`
}

// object is an object of a review as far as a conversion reads it: the
// metadata the API server takes from a converted object (labels and
// annotations) or checks (name, namespace, UID), and spec and status
// undecoded. The API server restores all other metadata from the object it
// sent (apiextensions-apiserver's restoreObjectMeta), so the rest, above
// all the managed fields that make up most of a stored object, is neither
// decoded nor sent back. Kinds with top-level fields beside spec and status
// are refused (specAndStatus).
type object struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Metadata   keptMetadata    `json:"metadata"`
	Spec       json.RawMessage `json:"spec"`
	Status     json.RawMessage `json:"status"`
}

type keptMetadata struct {
	Name        string            `json:"name,omitempty"`
	Namespace   string            `json:"namespace,omitempty"`
	UID         types.UID         `json:"uid,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

func (c Converter) review(uid types.UID, desiredAPIVersion string, objects []object) *apiextensionsv1.ConversionResponse {
	resp := &apiextensionsv1.ConversionResponse{UID: uid, Result: metav1.Status{Status: metav1.StatusSuccess}}
	desired, err := schema.ParseGroupVersion(desiredAPIVersion)
	if err != nil {
		return failed(resp, fmt.Sprintf("desiredAPIVersion %q: %v", desiredAPIVersion, err))
	}
	resp.ConvertedObjects = make([]runtime.RawExtension, 0, len(objects))
	for i := range objects {
		converted, err := c.convert(&objects[i], desired)
		if err != nil {
			return failed(resp, fmt.Sprintf("objects[%d]: %v", i, err))
		}
		resp.ConvertedObjects = append(resp.ConvertedObjects, runtime.RawExtension{Raw: converted})
	}
	return resp
}

func failed(resp *apiextensionsv1.ConversionResponse, message string) *apiextensionsv1.ConversionResponse {
	resp.ConvertedObjects = nil
	resp.Result = metav1.Status{Status: metav1.StatusFailure, Message: message, Reason: metav1.StatusReasonBadRequest, Code: http.StatusBadRequest}
	return resp
}

// Convert converts one object's JSON to version desired of its group,
// through the hub. The result's metadata is what the API server keeps of
// it: name, namespace, UID, labels and annotations.
func (c Converter) Convert(raw []byte, desired schema.GroupVersion) ([]byte, error) {
	var o object
	if err := json.Unmarshal(raw, &o); err != nil {
		return nil, err
	}
	return c.convert(&o, desired)
}

func (c Converter) convert(o *object, desired schema.GroupVersion) ([]byte, error) {
	from := schema.FromAPIVersionAndKind(o.APIVersion, o.Kind)
	name := klog.KRef(o.Metadata.Namespace, o.Metadata.Name).String()
	if from.Group != desired.Group {
		return nil, fmt.Errorf("%s %s is of group %q, not %q", from.Kind, name, from.Group, desired.Group)
	}
	in, err := c.Scheme.New(from)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", from.Kind, name, err)
	}
	if err := o.decodeInto(in); err != nil {
		return nil, fmt.Errorf("%s %s: decoding %s: %w", from.Kind, name, from.GroupVersion(), err)
	}
	to := desired.WithKind(from.Kind)
	out, err := c.Scheme.New(to)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", from.Kind, name, err)
	}
	if err := webhook.ConvertThroughHub(c.Scheme, in, out); err != nil {
		return nil, fmt.Errorf("%s %s: %w", from.Kind, name, err)
	}
	out.GetObjectKind().SetGroupVersionKind(to)
	converted, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("%s %s: encoding %s: %w", from.Kind, name, desired, err)
	}
	return converted, nil
}

// decodeInto fills into, a new object of o's kind, with o.
func (o *object) decodeInto(into runtime.Object) error {
	spec, status, err := specAndStatus(into)
	if err != nil {
		return err
	}
	accessor, err := meta.Accessor(into)
	if err != nil {
		return err
	}
	accessor.SetName(o.Metadata.Name)
	accessor.SetNamespace(o.Metadata.Namespace)
	accessor.SetUID(o.Metadata.UID)
	accessor.SetLabels(o.Metadata.Labels)
	accessor.SetAnnotations(o.Metadata.Annotations)
	for _, f := range []struct {
		raw  json.RawMessage
		into any
		name string
	}{{o.Spec, spec, "spec"}, {o.Status, status, "status"}} {
		if len(f.raw) == 0 {
			continue
		}
		if f.into == nil {
			return fmt.Errorf("%s: this kind has none", f.name)
		}
		if err := json.Unmarshal(f.raw, f.into); err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
	}
	return nil
}

// specAndStatus returns pointers to the spec and status of obj, a pointer
// to a struct of the API conventions' shape (type and object metadata,
// spec, status), nil for those it lacks. Any other top-level field is an
// error: object does not carry it, so a conversion would lose it.
func specAndStatus(obj runtime.Object) (spec, status any, err error) {
	v := reflect.ValueOf(obj)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return nil, nil, fmt.Errorf("%T is not a pointer to a struct", obj)
	}
	v = v.Elem()
	for i := range v.NumField() {
		field := v.Type().Field(i)
		name, _, _ := strings.Cut(field.Tag.Get("json"), ",")
		switch {
		case name == "spec":
			spec = v.Field(i).Addr().Interface()
		case name == "status":
			status = v.Field(i).Addr().Interface()
		case name == "metadata", name == "-", name == "" && field.Anonymous:
		default:
			return nil, nil, fmt.Errorf("%T has a top-level field %q, which conversion does not carry (only metadata, spec and status)", obj, name)
		}
	}
	return spec, status, nil
}
