# netop's developer entry points. CI runs `make verify`, `make test` and
# `make test-faults`.

GO ?= go
LDFLAGS := -s -w -X github.com/netop-dev/netop/internal/version.Version=$(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
# Build tags of every binary (internal/testing/gobuild's Tags, which the
# tests and benches build with): grpcnotrace keeps gRPC from linking
# golang.org/x/net/trace, whose html/template turns the linker's dead code
# elimination of methods off (bin/netop 42 MB instead of 71 MB).
GOTAGS := grpcnotrace

.PHONY: all build image test test-faults bench verify codegen vet lint fmt-check verify-codegen verify-consumer clean

all: build

build:
	$(GO) build -tags "$(GOTAGS)" -ldflags "$(LDFLAGS)" -o bin/netop ./cmd/netop
	$(GO) build -tags "$(GOTAGS)" -ldflags "$(LDFLAGS)" -o bin/netop-standalone ./cmd/netop-standalone
	CGO_ENABLED=0 $(GO) build -tags "$(GOTAGS)" -ldflags "$(LDFLAGS)" -o bin/netop-cni ./cmd/netop-cni

# netop's container image, built here without a registry or a container
# engine (see hack/image), as an image tarball that containerd imports and
# netop-standalone serves to its nodes (--image-archive); the last line
# printed is the image's reference, for netop manifests --image.
IMAGE ?= netop.local/netop:$(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
IMAGE_OUT ?= bin/netop-image.tar
image:
	CGO_ENABLED=0 $(GO) build -tags "$(GOTAGS)" -ldflags "$(LDFLAGS)" -o bin/netop-static ./cmd/netop
	CGO_ENABLED=0 $(GO) build -tags "$(GOTAGS)" -ldflags "$(LDFLAGS)" -o bin/netop-cni-static ./cmd/netop-cni
	$(GO) run ./hack/image --binary bin/netop-static --plugin bin/netop-cni-static --tag $(IMAGE) --out $(IMAGE_OUT)

# Tests run against a real control plane, real kernel bridges (as root) and a
# real Neutron (installed with apt when missing).
test:
	$(GO) test -count=1 -timeout 20m ./...

# The fault suite: SIGKILL during mass create and delete (several rounds,
# random kill points), the API server restarted under the controller, a slow
# failing backend, and Neutron going down mid-creation (with and without a
# SIGKILL of netop).
test-faults:
	NETOP_FAULT_NETWORKS=150 NETOP_FAULT_ROUNDS=3 $(GO) test -count=1 -v -timeout 20m -run 'SIGKILLDuringCreate' ./test/standalone/
	$(GO) test -count=1 -v -timeout 10m -tags faults ./test/faults/
	$(GO) test -count=1 -v -timeout 10m -run 'Outage' ./test/neutron/ ./test/standalone/

# The whole-system benchmark (as root); see BENCHMARKS.md.
bench:
	$(GO) run ./test/bench

codegen:
	hack/update-codegen.sh

verify: fmt-check vet lint verify-codegen verify-consumer

# golangci-lint (.golangci.yml: the standard linters plus the layering rules
# of depguard and the import aliases of importas), at the version pinned in
# the separate tools module hack/tools, so that its dependencies stay out of
# netop's go.mod. The first run builds it and analyses the whole dependency
# graph, which takes minutes; later runs use the Go and golangci-lint caches.
lint:
	$(GO) build -C hack/tools -o $(CURDIR)/bin/golangci-lint github.com/golangci/golangci-lint/v2/cmd/golangci-lint
	bin/golangci-lint run ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files --cached --others --exclude-standard '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...
	$(GO) vet -tags faults ./test/faults/

verify-codegen:
	hack/verify-codegen.sh

verify-consumer:
	hack/verify-consumer.sh

clean:
	rm -rf bin
