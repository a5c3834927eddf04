package webhook

import (
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
// kind's hub (the scheme's internal version) when the scheme has one, as
// the API server converts: versions convert to and from the hub only.
func (d *Decoder) Convert(in, out runtime.Object) error {
	gvks, _, err := d.scheme.ObjectKinds(in)
	if err != nil {
		return err
	}
	hub, err := d.scheme.New(gvks[0].GroupKind().WithVersion(runtime.APIVersionInternal))
	if err != nil {
		return d.scheme.Convert(in, out, nil)
	}
	if err := d.scheme.Convert(in, hub, nil); err != nil {
		return err
	}
	return d.scheme.Convert(hub, out, nil)
}
