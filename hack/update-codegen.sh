#!/usr/bin/env bash
# Regenerates everything that is derived from the API types in pkg/apis:
# deepcopy functions, the typed clientset, listers and informers
# (k8s.io/code-generator) and the CRD manifest (controller-gen). The tools run
# at the versions pinned by the `tool` directives in go.mod.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

module=$(go list -m)
apis=(samplecrd/v1 samplecrd/v2 netop/v1alpha1 cnat/v1alpha1 k8s.cni.cncf.io/v1beta1)
header=hack/boilerplate.go.txt
out=pkg/generated

# Not a version: deepcopy only. The hub (samplecrd) is the internal form
# every served version converts through.
hub=samplecrd
converted=(samplecrd/v1 samplecrd/v2)

input_pkgs=()
for gv in "${apis[@]}"; do input_pkgs+=("$module/pkg/apis/$gv"); done
deepcopy_pkgs=("${input_pkgs[@]}" "$module/pkg/apis/$hub")
conversion_pkgs=()
for gv in "${converted[@]}"; do conversion_pkgs+=("$module/pkg/apis/$gv"); done

# Remove what the generators made before, so that a type that went away does
# not leave stale files behind.
rm -rf "$out"
find pkg/apis -name 'zz_generated.*.go' -delete

go tool deepcopy-gen \
  --go-header-file "$header" \
  --output-file zz_generated.deepcopy.go \
  "${deepcopy_pkgs[@]}"

# Conversions between each version and the hub, where the fields match;
# the rest are the Convert_* functions written by hand beside them.
go tool conversion-gen \
  --go-header-file "$header" \
  --output-file zz_generated.conversion.go \
  "${conversion_pkgs[@]}"

# Apply configurations (Apply and ApplyStatus on the clientset), for clients
# of our API that write Networks by server-side apply.
go tool applyconfiguration-gen \
  --go-header-file "$header" \
  --output-dir "$out/applyconfiguration" \
  --output-pkg "$module/$out/applyconfiguration" \
  "${input_pkgs[@]}"

inputs=()
for gv in "${apis[@]}"; do inputs+=(--input "$gv"); done
go tool client-gen \
  --go-header-file "$header" \
  --clientset-name versioned \
  --apply-configuration-package "$module/$out/applyconfiguration" \
  --input-base "$module/pkg/apis" \
  --output-dir "$out/clientset" \
  --output-pkg "$module/$out/clientset" \
  "${inputs[@]}"

go tool lister-gen \
  --go-header-file "$header" \
  --output-dir "$out/listers" \
  --output-pkg "$module/$out/listers" \
  "${input_pkgs[@]}"

go tool informer-gen \
  --go-header-file "$header" \
  --output-dir "$out/informers" \
  --output-pkg "$module/$out/informers" \
  --versioned-clientset-package "$module/$out/clientset/versioned" \
  --listers-package "$module/$out/listers" \
  "${input_pkgs[@]}"

rm -f config/crd/*.yaml
go tool controller-gen crd:crdVersions=v1 paths=./pkg/apis/... output:crd:artifacts:config=config/crd

# controller-gen has no marker for a conversion webhook, so it is added
# here, as kubebuilder's kustomize patch does: the API server converts
# Networks between v1 and v2 through netop's conversion Service, whose
# caBundle netop injects at start and on every certificate renewal. A
# netop that reaches its webhook by URL (standalone) points it there.
crd=config/crd/samplecrd.k8s.io_networks.yaml
awk '{ print } /^spec:$/ && !done { done = 1
  print "  conversion:"
  print "    strategy: Webhook"
  print "    webhook:"
  print "      clientConfig:"
  print "        service:"
  print "          name: netop-conversion"
  print "          namespace: netop-system"
  print "          path: /convert"
  print "          port: 443"
  print "      conversionReviewVersions:"
  print "      - v1"
}' "$crd" > "$crd.tmp" && mv "$crd.tmp" "$crd"

# MultiNetworkPolicy is served, as upstream defines it, in v1beta1 (stored)
# and v1beta2, of one schema: no conversion is needed, so the version is
# the same schema again rather than a second package of identical types.
# The versions are the last field of the CRD.
crd=config/crd/k8s.cni.cncf.io_multi-networkpolicies.yaml
awk '/^  - name: v1beta1$/ { copying = 1 } { print } copying { copy = copy $0 "\n" }
END { sub(/^  - name: v1beta1/, "  - name: v1beta2", copy); sub(/storage: true\n$/, "storage: false\n", copy); printf "%s", copy }' "$crd" > "$crd.tmp" && mv "$crd.tmp" "$crd"
