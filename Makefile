# netwarden: `make demo` runs the main job on this machine, `make test` runs every test.
# Both install what they need (Debian packages via hack/deps.sh) and must run as root.

GO        ?= go
BIN       := bin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X github.com/netwarden/netwarden/internal/cli.Version=$(VERSION)
TEST_TIMEOUT ?= 25m

.PHONY: all deps build test demo bench bench-scale clean fmt vet

all: build

deps:
	@hack/deps.sh

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/netwarden ./cmd/netwarden
	$(GO) build -o $(BIN)/netwarden-demo ./cmd/netwarden-demo
	@# The CNI plugins are static: a runtime runs them from the host's CNI bin directory,
	@# whatever libc it has, and a static binary starts about 1 ms sooner (no dynamic loader).
	CGO_ENABLED=0 $(GO) build -o $(BIN)/netwarden-portmap ./cmd/netwarden-portmap
	CGO_ENABLED=0 $(GO) build -o $(BIN)/netwarden-ipmasq ./cmd/netwarden-ipmasq
	CGO_ENABLED=0 $(GO) build -o $(BIN)/netwarden-gate ./cmd/netwarden-gate

# Kernel tests find the agent binary through NETWARDEN_BIN; API tests find kube-apiserver, etcd and
# kubectl through KUBE_BIN_DIR (built once from Go modules, then cached by version).
test: deps build vet
	@kubebin=$$(hack/kube-binaries.sh) && \
	NETWARDEN_BIN=$(CURDIR)/$(BIN)/netwarden KUBE_BIN_DIR=$$kubebin $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...

vet:
	$(GO) vet ./...

demo: deps build
	$(BIN)/netwarden-demo --agent $(CURDIR)/$(BIN)/netwarden --examples $(CURDIR)/examples

# Kernel benchmarks need root. Each reports its figures as custom metrics (ms, conn/s, MiB).
# The benchmarks against a real kube-apiserver find it through KUBE_BIN_DIR, as the tests do.
bench: deps build
	@kubebin=$$(hack/kube-binaries.sh) && \
	NETWARDEN_BIN=$(CURDIR)/$(BIN)/netwarden KUBE_BIN_DIR=$$kubebin $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 30m ./internal/... ./test/... | tee bench.out

# Kubernetes' own limits against a real kube-apiserver (150,000 pods, 10,000 namespaces, 5,000
# nodes, 10,000 NetworkPolicies, 1,000 ClusterNetworkPolicies): loading them alone takes minutes,
# so it is not in `make bench`. NETWARDEN_SCALE_PODS=15000 runs a smaller cluster in proportion.
bench-scale: deps build
	@kubebin=$$(hack/kube-binaries.sh) && \
	NETWARDEN_BIN=$(CURDIR)/$(BIN)/netwarden KUBE_BIN_DIR=$$kubebin $(GO) test -tags scale -run '^$$' -bench . -benchtime 1x -timeout 120m -v ./test/scale | tee bench-scale.out

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN)

# The container image, built in Go without a container engine (cmd/netwarden-image): bin/image/oci
# (an OCI layout holding every IMAGE_ARCHS platform) and bin/image/netwarden-<arch>.tar (for docker
# load, podman load, ctr images import, kind load image-archive). Timestamps are the last commit's,
# so a rebuild of the same commit from the same Debian packages gives the same digest.
IMAGE_ARCHS ?= amd64
IMAGE_TAG   ?= $(VERSION)
IMAGE_EPOCH := $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
IMAGE_FLAGS  = --arch $(shell echo $(IMAGE_ARCHS) | tr ' ' ,) --version $(VERSION) --cache $(CURDIR)/$(BIN)/image-cache

.PHONY: image push
image:
	SOURCE_DATE_EPOCH=$(IMAGE_EPOCH) $(GO) run ./cmd/netwarden-image $(IMAGE_FLAGS) --out $(BIN)/image --tag ghcr.io/netwarden/netwarden:$(IMAGE_TAG)

# make push REGISTRY=registry.example.com/team: credentials come from docker/podman login.
push:
	@test -n "$(REGISTRY)" || { echo "make push: set REGISTRY, such as REGISTRY=ghcr.io/me" >&2; exit 1; }
	SOURCE_DATE_EPOCH=$(IMAGE_EPOCH) $(GO) run ./cmd/netwarden-image $(IMAGE_FLAGS) --push $(REGISTRY)/netwarden:$(IMAGE_TAG)

# kube-apiserver and etcd for the integration tests (internal/testkit/kubetest), built from Go modules and
# cached by version (a second run is instant). The last line printed is their directory: tests find
# them through KUBE_BIN_DIR="$(hack/kube-binaries.sh | tail -n1)".
.PHONY: kube-binaries
kube-binaries:
	@hack/kube-binaries.sh
