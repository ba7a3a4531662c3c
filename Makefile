# ms2m — see README.md. Every target prepares what it needs itself.
GO      ?= go
GOFLAGS ?=
BIN     := bin
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: all build test test-unit setup bench bench-webhook fuzz demo vet clean k8s-bin

# Test control plane for the envtest suites (internal/webhook): a real
# kube-apiserver and etcd, built once from Go modules by the tools module in
# hack/k8s into bin/k8s. The stamp names the version, so a warm `make` does
# nothing and a version bump rebuilds. A cold build takes 8-13 minutes on
# 2 cores; `make clean` removes it.
K8S_VERSION ?= v1.37.2
K8S_BIN     := $(CURDIR)/$(BIN)/k8s
K8S_STAMP   := $(K8S_BIN)/.built-$(K8S_VERSION)
K8S_LDFLAGS := -s -w \
	-X k8s.io/component-base/version.gitVersion=$(K8S_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 \
	-X k8s.io/component-base/version.gitMinor=37 \
	-X k8s.io/client-go/pkg/version.gitVersion=$(K8S_VERSION)

all: build

## build: compile every binary into bin/
build:
	$(GO) build $(GOFLAGS) -o $(BIN)/ ./cmd/... ./examples/consumer ./examples/producer

## setup: prepare the broker, its stream plugin, a test user and python3-pika (idempotent)
setup:
	@bash hack/setup.sh

## test: the whole suite against the real broker and real clients (CI runs this)
test: export KUBEBUILDER_ASSETS := $(K8S_BIN)
test: setup k8s-bin
	$(GO) vet ./...
	$(GO) test $(GOFLAGS) -count=1 -timeout 25m ./...

## test-unit: only the tests that need no broker
test-unit:
	$(GO) test $(GOFLAGS) -count=1 -short ./...

## bench: direct against through-the-sidecar, side by side; writes BENCHMARKS.md figures to stdout
bench: setup build bench-webhook
	$(GO) run ./hack/bench $(BENCHFLAGS)

## bench-webhook: admission latency of the webhook through a real kube-apiserver (WEBHOOK_PODS pods)
WEBHOOK_PODS ?= 300
bench-webhook: export KUBEBUILDER_ASSETS := $(K8S_BIN)
bench-webhook: k8s-bin
	$(GO) test -count=1 -run '^$$' -bench '^BenchmarkAdmission$$' -benchtime $(WEBHOOK_PODS)x ./internal/webhook/

## k8s-bin: build kube-apiserver and etcd for envtest into bin/k8s (once; warm runs do nothing)
k8s-bin: $(K8S_STAMP)
$(K8S_STAMP): hack/k8s/go.mod hack/k8s/go.sum
	@mkdir -p $(K8S_BIN)
	cd hack/k8s && GOWORK=off CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(K8S_LDFLAGS)' -o $(K8S_BIN)/kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
	cd hack/k8s && GOWORK=off CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(K8S_BIN)/etcd go.etcd.io/etcd/server/v3
	@rm -f $(K8S_BIN)/.built-* && touch $@

## fuzz: run every fuzz target for FUZZTIME each (default 30s)
FUZZTIME ?= 30s
fuzz:
	@for t in $$($(GO) test -list '^Fuzz' ./internal/amqpwire/ | grep ^Fuzz); do \
		$(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) ./internal/amqpwire/ || exit 1; done
	@for t in $$($(GO) test -list '^Fuzz' ./internal/shadowqueue/ | grep ^Fuzz); do \
		$(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) ./internal/shadowqueue/ || exit 1; done

## demo: a producer and an unmodified consumer behind the sidecar, then a stop at a cutoff
demo: setup build
	@bash hack/demo.sh

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)

clean:
	rm -rf $(BIN) out
