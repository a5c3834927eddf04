// Package conversion serves a CustomResourceDefinition's conversion
// webhook: the API server POSTs apiextensions.k8s.io/v1 ConversionReviews,
// objects of one version to be returned in another. Every object goes
// through its group's hub (the scheme's internal version), never from
// version to version, so that each version needs two conversions only.
// The conversions are the scheme's (conversion-gen's and the hand-written
// ones beside the types); this package knows no kind.
package conversion

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
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
		// Decoded with a Decoder, which scans the body once to find its
		// end where Unmarshal validates it first, each object split into
		// its fields: JSON scanning is most of a conversion's cost.
		review := &reviewIn{}
		if err := json.NewDecoder(bytes.NewReader(body)).Decode(review); err != nil {
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

// objectFields are an object's top-level fields, undecoded.
type objectFields map[string]json.RawMessage

// reviewIn is a ConversionReview as the handler reads it.
type reviewIn struct {
	metav1.TypeMeta `json:",inline"`
	Request         *struct {
		UID               types.UID      `json:"uid"`
		DesiredAPIVersion string         `json:"desiredAPIVersion"`
		Objects           []objectFields `json:"objects"`
	} `json:"request"`
}

// Review converts every object of req, or none: one that fails fails the
// review, with a message naming it.
func (c Converter) Review(req *apiextensionsv1.ConversionRequest) *apiextensionsv1.ConversionResponse {
	objects := make([]objectFields, len(req.Objects))
	for i, raw := range req.Objects {
		if err := json.Unmarshal(raw.Raw, &objects[i]); err != nil {
			return failed(&apiextensionsv1.ConversionResponse{UID: req.UID}, fmt.Sprintf("objects[%d]: not a JSON object: %v", i, err))
		}
	}
	return c.review(req.UID, req.DesiredAPIVersion, objects)
}

func (c Converter) review(uid types.UID, desiredAPIVersion string, objects []objectFields) *apiextensionsv1.ConversionResponse {
	resp := &apiextensionsv1.ConversionResponse{UID: uid, Result: metav1.Status{Status: metav1.StatusSuccess}}
	desired, err := schema.ParseGroupVersion(desiredAPIVersion)
	if err != nil {
		return failed(resp, fmt.Sprintf("desiredAPIVersion %q: %v", desiredAPIVersion, err))
	}
	resp.ConvertedObjects = make([]runtime.RawExtension, 0, len(objects))
	for i, fields := range objects {
		converted, err := c.convert(fields, desired)
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

// keptMetadata is the metadata the API server takes from a converted
// object (labels and annotations) or checks (name, namespace, UID): it
// restores all other metadata from the object it sent
// (apiextensions-apiserver's restoreObjectMeta), so the rest, above all
// the managed fields that make up most of a stored object, is neither
// decoded nor sent back.
type keptMetadata struct {
	Name        string            `json:"name,omitempty"`
	Namespace   string            `json:"namespace,omitempty"`
	UID         types.UID         `json:"uid,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Convert converts one object's JSON to version desired of its group,
// through the hub. The result's metadata is what the API server keeps of
// it: name, namespace, UID, labels and annotations.
func (c Converter) Convert(raw []byte, desired schema.GroupVersion) ([]byte, error) {
	var fields objectFields
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	return c.convert(fields, desired)
}

func (c Converter) convert(fields objectFields, desired schema.GroupVersion) ([]byte, error) {
	if fields == nil {
		return nil, errors.New("not a JSON object")
	}
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	var meta keptMetadata
	for key, into := range map[string]any{"apiVersion": &head.APIVersion, "kind": &head.Kind, "metadata": &meta} {
		if value, ok := fields[key]; ok {
			if err := json.NewDecoder(bytes.NewReader(value)).Decode(into); err != nil {
				return nil, fmt.Errorf("%s: %w", key, err)
			}
		}
	}
	from := schema.FromAPIVersionAndKind(head.APIVersion, head.Kind)
	name := klog.KRef(meta.Namespace, meta.Name).String()
	if from.Group != desired.Group {
		return nil, fmt.Errorf("%s %s is of group %q, not %q", from.Kind, name, from.Group, desired.Group)
	}
	kept, err := json.Marshal(&meta)
	if err != nil {
		return nil, err
	}
	fields["metadata"] = kept
	raw, err := json.Marshal(fields)
	if err != nil {
		return nil, err
	}
	in, err := c.Scheme.New(from)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", from.Kind, name, err)
	}
	if err := json.Unmarshal(raw, in); err != nil {
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
