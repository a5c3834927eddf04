// Package config embeds the manifests under config/ (the CRDs that
// controller-gen makes from the API types, and the namespace, RBAC, the
// admission policies, the controller Deployment and the agent DaemonSet
// for running netop in a cluster), so that the binaries can
// install and print exactly the manifests they were built with.
package config

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

//go:embed crd/*.yaml namespace/*.yaml rbac/*.yaml policy/*.yaml manager/*.yaml
var files embed.FS

// CRDs returns the CustomResourceDefinitions of netop's API.
func CRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, doc := range documents("crd") {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(doc, crd); err != nil {
			return nil, fmt.Errorf("decoding embedded CRD: %w", err)
		}
		crds = append(crds, crd)
	}
	return crds, nil
}

// SharedGroup is the API group of the CRDs netop serves but does not own:
// MultiNetworkPolicy, whose CRD another project (multi-networkpolicy, a
// network plugin) may have installed first. netop installs it only when
// it is missing and never rewrites another's.
const SharedGroup = "k8s.cni.cncf.io"

// Shared reports whether crd is of SharedGroup.
func Shared(crd *apiextensionsv1.CustomResourceDefinition) bool {
	return crd.Spec.Group == SharedGroup
}

// sharedDocument reports whether the embedded CRD document doc is Shared.
func sharedDocument(doc []byte) bool {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	return yaml.Unmarshal(doc, crd) == nil && Shared(crd)
}

// Policies returns the admission policies (policy/): the
// ValidatingAdmissionPolicies and their bindings that the API server
// enforces without netop in the path.
func Policies() ([]*admissionregistrationv1.ValidatingAdmissionPolicy, []*admissionregistrationv1.ValidatingAdmissionPolicyBinding, error) {
	var policies []*admissionregistrationv1.ValidatingAdmissionPolicy
	var bindings []*admissionregistrationv1.ValidatingAdmissionPolicyBinding
	for _, doc := range documents("policy") {
		var kind struct{ Kind string }
		if err := yaml.Unmarshal(doc, &kind); err != nil {
			return nil, nil, fmt.Errorf("decoding embedded policy: %w", err)
		}
		var err error
		switch kind.Kind {
		case "ValidatingAdmissionPolicy":
			p := &admissionregistrationv1.ValidatingAdmissionPolicy{}
			err = yaml.UnmarshalStrict(doc, p)
			policies = append(policies, p)
		case "ValidatingAdmissionPolicyBinding":
			b := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
			err = yaml.UnmarshalStrict(doc, b)
			bindings = append(bindings, b)
		default:
			err = fmt.Errorf("unexpected kind %q", kind.Kind)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("decoding embedded policy: %w", err)
		}
	}
	return policies, bindings, nil
}

// DefaultImage is the image the manifests name unless told another.
const DefaultImage = "ghcr.io/netop-dev/netop:latest"

// DefaultCNIBinDir is the hosts' path the manifests name unless told
// another: where the agents install the CNI plugin.
const DefaultCNIBinDir = "/opt/cni/bin"

// Options are what a cluster may need to change in the manifests; empty
// fields keep the defaults.
type Options struct {
	// Image is the image the controller and the agents run.
	Image string
	// CNIBinDir is the nodes' CNI plugin directory, as their container
	// runtime is configured.
	CNIBinDir string
	// WithoutSharedCRDs leaves out the CRDs of SharedGroup, for clusters
	// where another project installed them: an apply would replace their
	// definition by netop's.
	WithoutSharedCRDs bool
}

// All returns every manifest, CRDs first, as one multi-document YAML stream
// that `kubectl apply -f -` takes: every object after what it needs (the
// namespace before the Role in it).
func All(o Options) []byte {
	var replace []string
	for _, r := range []struct{ prefix, from, to string }{
		{"image: ", DefaultImage, o.Image}, {"", DefaultCNIBinDir, o.CNIBinDir},
	} {
		if r.to != "" {
			replace = append(replace, r.prefix+r.from, r.prefix+r.to)
		}
	}
	replacer := strings.NewReplacer(replace...)
	var out bytes.Buffer
	for _, dir := range []string{"crd", "namespace", "rbac", "policy", "manager"} {
		for _, doc := range documents(dir) {
			if dir == "crd" && o.WithoutSharedCRDs && sharedDocument(doc) {
				continue
			}
			if dir == "manager" {
				doc = []byte(replacer.Replace(string(doc)))
			}
			out.WriteString("---\n")
			out.Write(bytes.TrimSpace(doc))
			out.WriteString("\n")
		}
	}
	return out.Bytes()
}

// documents returns the YAML documents of the files in dir, in file name order.
func documents(dir string) [][]byte {
	names, _ := fs.Glob(files, dir+"/*.yaml")
	sort.Strings(names)
	var docs [][]byte
	for _, name := range names {
		data, _ := files.ReadFile(name)
		for _, doc := range bytes.Split(data, []byte("\n---")) {
			doc = bytes.TrimPrefix(bytes.TrimSpace(doc), []byte("---"))
			if len(bytes.TrimSpace(doc)) > 0 {
				docs = append(docs, doc)
			}
		}
	}
	return docs
}
