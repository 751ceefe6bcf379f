# netwarden: `make demo` runs the main job on this machine, `make test` runs every test.
# Both install what they need (Debian packages via hack/deps.sh) and must run as root.

GO        ?= go
BIN       := bin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X github.com/netwarden/netwarden/internal/cli.Version=$(VERSION)
TEST_TIMEOUT ?= 25m

.PHONY: all deps build test demo bench bench-scale conformance clean fmt vet

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
	$(GO) build -o $(BIN)/netwarden-cluster ./cmd/netwarden-cluster

# Kernel tests find the agent binary through NETWARDEN_BIN; API tests find kube-apiserver, etcd and
# kubectl through KUBE_BIN_DIR (built once from Go modules, then cached by version).
test: deps build vet
	@kubebin=$$(hack/kube-binaries.sh) && hack/kube-binaries.sh e2e >/dev/null && \
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

# The field's own suites, unmodified, against a cluster of two nodes on this machine
# (test/conformance, internal/testkit/minicluster), on both backends: the Kubernetes e2e
# NetworkPolicy tests (e2e.test, built by hack/kube-binaries.sh e2e) and the network-policy-api
# conformance suite (hack/conformance.sh). It takes an hour or more, so make test runs a part.
conformance: deps build
	@kubebin=$$(hack/kube-binaries.sh) && hack/kube-binaries.sh e2e >/dev/null && \
	{ NETWARDEN_CONFORMANCE=full NETWARDEN_BIN=$(CURDIR)/$(BIN)/netwarden KUBE_BIN_DIR=$$kubebin \
		$(GO) test -count=1 -v -timeout 6h ./test/conformance; echo $$? > conformance.rc; } 2>&1 | tee conformance.out; \
	exit $$(cat conformance.rc)

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

# A Kubernetes cluster of CLUSTER_NODES nodes on this machine, without a container engine
# (internal/testkit/minicluster): the control plane on loopback, each node a network namespace
# running kube-proxy, netwarden as deploy/ runs it, and a node daemon whose pods are network
# namespaces through the CNI chain (upstream bridge and host-local, netwarden-portmap,
# netwarden-gate). It runs in the background until make cluster-down.
CLUSTER_NODES      ?= 2
CLUSTER_PROXY_MODE ?= nftables
CLUSTER_STATE      ?= /run/netwarden-cluster
.PHONY: cluster-up cluster-down cni-upstream
cni-upstream:
	CGO_ENABLED=0 $(GO) build -o $(BIN)/cni-upstream/ github.com/containernetworking/plugins/plugins/main/bridge github.com/containernetworking/plugins/plugins/ipam/host-local

cluster-up: deps build cni-upstream
	@kubebin=$$(hack/kube-binaries.sh) && \
	$(BIN)/netwarden-cluster up --state $(CLUSTER_STATE) --nodes $(CLUSTER_NODES) --proxy-mode $(CLUSTER_PROXY_MODE) \
		--kube-bin-dir $$kubebin --agent $(BIN)/netwarden --deploy deploy --cni-bin-dir $(BIN)/cni-upstream --cni-bin-dir $(BIN) && \
	echo "kubectl is $$kubebin/kubectl; try: $$kubebin/kubectl --kubeconfig $(CLUSTER_STATE)/kubeconfig get nodes -o wide"

cluster-down:
	$(BIN)/netwarden-cluster down --state $(CLUSTER_STATE)
