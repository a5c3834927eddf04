# netop's developer entry points. CI runs `make verify` and `make test`.

GO ?= go
# The Kubernetes version that netop-standalone embeds, stamped like a release.
KUBE_VERSION := $(shell $(GO) list -m -f '{{.Version}}' k8s.io/kubernetes)
LDFLAGS := -s -w -X github.com/netop-dev/netop/internal/version.Version=$(shell git describe --tags --always --dirty 2>/dev/null || echo devel)

.PHONY: all build test test-faults bench verify codegen vet fmt-check verify-codegen verify-consumer clean

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/netop ./cmd/netop
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/netop-standalone ./cmd/netop-standalone

# Tests run against a real control plane and, as root, real kernel bridges.
test:
	$(GO) test -count=1 -timeout 20m ./...

# The fault suite: SIGKILL during mass create and delete (several rounds,
# random kill points), the API server restarted under the controller, a slow
# failing backend, and Neutron going down mid-creation.
test-faults:
	NETOP_FAULT_NETWORKS=150 NETOP_FAULT_ROUNDS=3 $(GO) test -count=1 -v -timeout 20m -run 'SIGKILLDuringCreate' ./cmd/netop-standalone/
	$(GO) test -count=1 -v -timeout 10m -tags faults ./test/faults/
	$(GO) test -count=1 -v -timeout 10m -run 'Outage' ./test/neutron/ ./cmd/netop-standalone/

# The whole-system benchmark (as root); see BENCHMARKS.md.
bench:
	$(GO) run ./test/bench

codegen:
	hack/update-codegen.sh

verify: fmt-check vet verify-codegen verify-consumer

fmt-check:
	@out=$$(gofmt -l $$(git ls-files --cached --others --exclude-standard '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

verify-# The fault suite: SIGKILL during mass create and delete (several rounds,
# random kill points), the API server restarted under the controller, a slow
# failing backend, and Neutron going down mid-creation.
test-faults:
	NETOP_FAULT_NETWORKS=150 NETOP_FAULT_ROUNDS=3 $(GO) test -count=1 -v -timeout 20m -run 'SIGKILLDuringCreate' ./cmd/netop-standalone/
	$(GO) test -count=1 -v -timeout 10m -tags faults ./test/faults/
	$(GO) test -count=1 -v -timeout 10m -run 'Outage' ./test/neutron/ ./cmd/netop-standalone/

# The whole-system benchmark (as root); see BENCHMARKS.md.
bench:
	$(GO) run ./test/bench

codegen:
	hack/verify-codegen.sh

verify-consumer:
	hack/verify-consumer.sh

clean:
	rm -rf bin
