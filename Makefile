# ms2m — see README.md. Every target prepares what it needs itself.
GO      ?= go
GOFLAGS ?=
BIN     := bin
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: images push registry all build test test-unit setup bench bench-paper bench-memory bench-drain bench-webhook fuzz demo vet clean k8s-bin
.PHONY: node-bin crio-bin criu node-setup consumer-spring consumer-nats-python consumer-nats-node

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

# A real node for checkpoint and restore through the kubelet: the kubelet,
# kube-proxy (Service routing, nftables mode), kube-controller-manager and
# kube-scheduler from the same hack/k8s module (into bin/k8s beside the
# envtest control plane), and containerd, ctr and
# the runc shim from the hack/containerd module (into bin/containerd).
# containerd's version is read from hack/containerd/go.mod, so the stamp
# always names what was built. Everything builds with CGO_ENABLED=0: the
# only cgo user left in containerd is PKCS#11 image decryption, which the
# node does not need. A cold build of all six takes 10-18 minutes on
# 2 cores (most of it the kubelet and controller-manager), a rebuild with a
# warm Go build cache about 6 s, and a warm `make node-bin` does nothing.
NODE_STAMP         := $(K8S_BIN)/.node-built-$(K8S_VERSION)-with-kube-proxy
# kubectl (bin/k8s/kubectl) from the same module, for the e2e test that runs a
# real `kubectl drain` against the cluster (about 25 s cold with the module's
# other binaries already in the Go build cache), with a stamp of its own.
KUBECTL_STAMP      := $(K8S_BIN)/.kubectl-built-$(K8S_VERSION)
CONTAINERD_VERSION := $(shell awk '$$1 == "require" && $$2 == "github.com/containerd/containerd/v2" {print $$3}' hack/containerd/go.mod)
CONTAINERD_BIN     := $(CURDIR)/$(BIN)/containerd
CONTAINERD_STAMP   := $(CONTAINERD_BIN)/.built-$(CONTAINERD_VERSION)
CONTAINERD_LDFLAGS := -s -w -X github.com/containerd/containerd/v2/version.Version=$(CONTAINERD_VERSION)
# CRI-O, the second runtime a node can run, from the hack/crio module (into
# bin/crio), with Debian's conmon and runc (hack/setup.sh node). Its version
# is read from hack/crio/go.mod like containerd's. CGO_ENABLED=0 needs the
# stub/exclude tags below (no ostree, gpgme, btrfs or devicemapper; the node
# uses overlay or vfs storage). About 4 minutes on 2 cores here (modules
# downloaded, the Go cache warm from the other tools modules); a
# prerequisite of `make test`, which runs one migration on CRI-O nodes.
# pinns, the small C helper CRI-O pins a pod's namespaces with, is not in
# Debian: it is compiled statically from the module's own pinns/src with cc
# (under a second).
CRIO_VERSION := $(shell awk '$$1 == "require" && $$2 == "github.com/cri-o/cri-o" {print $$3}' hack/crio/go.mod)
CRIO_BIN     := $(CURDIR)/$(BIN)/crio
CRIO_STAMP   := $(CRIO_BIN)/.built-$(CRIO_VERSION)
CRIO_TAGS    := containers_image_ostree_stub containers_image_openpgp exclude_graphdriver_btrfs exclude_graphdriver_devicemapper

# CRIU >= 4.2 for checkpoint and restore, installed privately into bin/criu
# by hack/install-criu.sh (Debian 12's criu is too old for this kernel).
CRIU_DIR := $(CURDIR)/$(BIN)/criu

all: build

## build: compile every binary into bin/
build:
	$(GO) build $(GOFLAGS) -o $(BIN)/ ./cmd/... ./examples/consumer ./examples/producer

## setup: prepare the broker, its stream plugin, a test user, python3-pika and nats-server with JetStream (idempotent)
setup:
	@bash hack/setup.sh

## test: the whole suite against the real broker, real clients, a real
## control plane and a local cluster of real nodes (CI runs this). A first run
## builds the control plane, kubelet and containerd (10-18 minutes on 2 cores)
## and installs CRIU; warm runs reuse them.
test: export KUBEBUILDER_ASSETS := $(K8S_BIN)
test: setup k8s-bin node-setup node-bin crio-bin criu helm-bin consumer-spring consumer-nats-python consumer-nats-node
	$(GO) vet ./...
	cd $(BENCH_MOD) && GOWORK=off $(GO) vet ./...
	$(MAKE) --no-print-directory lint
	$(GO) test $(GOFLAGS) -count=1 -timeout 25m $$($(GO) list ./... | grep -v /e2e)
	cd $(BENCH_MOD) && GOWORK=off $(GO) test $(GOFLAGS) -count=1 -timeout 10m ./...
	MS2M_E2E_FAULTS=$(MS2M_E2E_FAULTS) $(GO) test $(GOFLAGS) -count=1 -timeout 55m -p 1 ./e2e/...
	MS2M_E2E_RUNTIME=$(E2E_CRIO_RUNTIME) $(GO) test $(GOFLAGS) -count=1 -timeout 15m -p 1 -run '$(E2E_CRIO_RUN)' ./e2e/
	$(MAKE) --no-print-directory chart-test

## E2E_CRIO_RUN: the e2e tests make test runs again on CRI-O nodes, on a mixed cluster (E2E_CRIO_RUNTIME: node-1 and node-2 CRI-O,
## node-3 containerd; MS2M_E2E_RUNTIME, docs/runtimes.md): ms2m and statefulset between the CRI-O nodes, the agent's thaw at
## the dump through runc, and the refusal across runtimes.
E2E_CRIO_RUN ?= ^TestFirstRealMigration$$/^consumer$$/^ms2m$$|^TestEveryStrategyByAnnotation$$/^go$$/^statefulset$$/^statefulset$$|^TestHoldUntilFrozen$$/^thaw-at-dump-1$$|^TestMixedRuntimesRefused$$
E2E_CRIO_RUNTIME ?= crio,crio,containerd

## e2e: the end-to-end suite against an existing cluster with ms2m installed, given by
## KUBECONFIG (one that `go run ./hack/cluster up --with-ms2m` made, say), instead of a
## cluster of its own as in `make test`: the tests that drive ms2m by annotation or by
## the CLI run against the installed webhook, controller and agents; those that need the
## suite's own cluster skip, saying why. Skipped without a KUBECONFIG. E2E_RUN picks
## tests (go test -run); MS2M_E2E_* describe the cluster (docs/local-cluster.md).
E2E_RUN ?=
## MS2M_E2E_PINGPONG(_STS): how often TestPingPong migrates the Deployment's (the StatefulSet's) pod (make test: 3 and 2).
MS2M_E2E_PINGPONG ?= 20
MS2M_E2E_PINGPONG_STS ?= 10
## MS2M_E2E_FAULTS: 1 runs the fault matrix's real-node samples (docs/faults.md names them; most need the suite's own cluster).
MS2M_E2E_FAULTS ?= 1
.PHONY: e2e
e2e:
ifeq ($(strip $(KUBECONFIG)),)
	@echo "e2e: skipped: no KUBECONFIG. Run the suite against a cluster with ms2m installed:"
	@echo "  go run ./hack/cluster up --with-ms2m && make e2e KUBECONFIG=/var/tmp/ms2m-cluster/kubeconfig"
	@echo "(make test runs it on a cluster of its own)"
else
	@$(MAKE) --no-print-directory setup
	MS2M_E2E_KUBECONFIG=$(abspath $(KUBECONFIG)) MS2M_E2E_PINGPONG=$(MS2M_E2E_PINGPONG) MS2M_E2E_PINGPONG_STS=$(MS2M_E2E_PINGPONG_STS) MS2M_E2E_FAULTS=$(MS2M_E2E_FAULTS) $(GO) test $(GOFLAGS) -count=1 -timeout 40m -p 1 -v ./e2e/ $(if $(E2E_RUN),-run '$(E2E_RUN)')
endif

## soak: migrate again and again, check every migration, one JSON record each in out/soak/<mode>.jsonl;
## resumable (run it again) and safe to stop (Ctrl-C). SOAKFLAGS: '-mode pingpong' (real nodes, TestPingPong
## in chunks under -node-lock) or '-mode sim' (simulated cluster, randomized faults), '-count N', '-out DIR'
## (go run ./hack/soak -h); `go run ./hack/soak summary -in DIR` prints the table. docs/soak.md.
SOAKFLAGS ?=
.PHONY: soak
soak: export KUBEBUILDER_ASSETS := $(K8S_BIN)
soak: setup k8s-bin node-setup node-bin criu
	$(GO) run ./hack/soak $(SOAKFLAGS)

## test-unit: only the tests that need no broker
test-unit:
	$(GO) test $(GOFLAGS) -count=1 -short ./...
	cd $(BENCH_MOD) && GOWORK=off $(GO) test $(GOFLAGS) -count=1 -short ./...

# The benchmarks are a module of their own (hack/bench/go.mod: gonum's
# plotting stays out of the product's go.mod), run from the root (the bench
# moves there itself) and vetted, linted and tested beside the main module.
BENCH_MOD := hack/bench

## bench: direct against through-the-sidecar, side by side; writes BENCHMARKS.md figures to stdout
bench: setup build bench-webhook node-setup node-bin criu k8s-bin
	GOWORK=off $(GO) -C $(BENCH_MOD) run . $(BENCHFLAGS)

## bench-paper: the paper's evaluation (section IV-B, Figs 5-14) on a local cluster of real nodes:
## stop-and-copy, ms2m, ms2m-cutoff, statefulset and statefulset-shadow at 4, 10 and 16 msg/s (and
## ms2m-cutoff at 19), 10 runs each; CSV, JSON and PNG figures in out/bench-paper, PASS/MISS goals,
## and its section of BENCHMARKS.md. About 80 minutes; BENCHPAPERFLAGS='-quick' is a smoke run
## (one run per strategy at 16 msg/s), '-runs 3', '-sweep' adds 1..19 msg/s, '-strategies ...,ms2m-cutoff-adaptive'
## adds ms2m-cutoff by the adaptive rule beside the formula (see go -C hack/bench run . paper -h).
BENCHPAPERFLAGS ?=
bench-paper: setup build node-setup node-bin criu k8s-bin
	GOWORK=off $(GO) -C $(BENCH_MOD) run . paper $(BENCHPAPERFLAGS)

## bench-memory: migration time against memory on real nodes: stop-and-copy and ms2m of a consumer holding
## 10, 100 and 1000 MiB of extra state, 3 runs each; results, figures and section.md in out/bench-memory.
## BENCHMEMORYFLAGS: e.g. '-sizes 10,100 -runs 1' (see go -C hack/bench run . memory -h).
BENCHMEMORYFLAGS ?=
bench-memory: setup build node-setup node-bin criu k8s-bin
	GOWORK=off $(GO) -C $(BENCH_MOD) run . memory $(BENCHMEMORYFLAGS)

## bench-drain: kubectl drain by migration on three real nodes: drain time and each pod's processing gap against the number of
## opted-in consumers on the drained node (1, 4, 8, 16 at the per-node limit 2) and the per-node limit (1, 2, 4 at 8 consumers),
## every hash checked; results, figures and section.md in out/bench-drain. About 30 minutes on 2 cores.
## BENCHDRAINFLAGS: e.g. '-consumers 1,4 -limits 2 -runs 3' (see go -C hack/bench run . drain -h).
BENCHDRAINFLAGS ?=
bench-drain: setup build node-setup node-bin criu k8s-bin
	GOWORK=off $(GO) -C $(BENCH_MOD) run . drain $(BENCHDRAINFLAGS)

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

## node-bin: build kubelet, kube-proxy, kube-controller-manager, kube-scheduler, kubectl (bin/k8s) and containerd, ctr, containerd-shim-runc-v2 (bin/containerd) (once; warm runs do nothing)
node-bin: $(NODE_STAMP) $(KUBECTL_STAMP) $(CONTAINERD_STAMP)
$(NODE_STAMP): hack/k8s/go.mod hack/k8s/go.sum
	@mkdir -p $(K8S_BIN)
	cd hack/k8s && GOWORK=off CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(K8S_LDFLAGS)' -o $(K8S_BIN)/ \
		k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
		k8s.io/kubernetes/cmd/kube-proxy
	@rm -f $(K8S_BIN)/.node-built-* && touch $@
$(KUBECTL_STAMP): hack/k8s/go.mod hack/k8s/go.sum
	@mkdir -p $(K8S_BIN)
	cd hack/k8s && GOWORK=off CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(K8S_LDFLAGS)' -o $(K8S_BIN)/kubectl k8s.io/kubernetes/cmd/kubectl
	@rm -f $(K8S_BIN)/.kubectl-built-* && touch $@
$(CONTAINERD_STAMP): hack/containerd/go.mod hack/containerd/go.sum
	@test -n "$(CONTAINERD_VERSION)" || { echo "no github.com/containerd/containerd/v2 require line in hack/containerd/go.mod" >&2; exit 1; }
	@mkdir -p $(CONTAINERD_BIN)
	cd hack/containerd && GOWORK=off CGO_ENABLED=0 $(GO) build -trimpath -tags no_btrfs -ldflags '$(CONTAINERD_LDFLAGS)' -o $(CONTAINERD_BIN)/ \
		github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/ctr github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
	@rm -f $(CONTAINERD_BIN)/.built-* && touch $@

## crio-bin: build CRI-O and its pinns helper (bin/crio) from hack/crio and install Debian's conmon (once; warm runs do nothing)
crio-bin: node-setup $(CRIO_STAMP)
$(CRIO_STAMP): hack/crio/go.mod hack/crio/go.sum
	@test -n "$(CRIO_VERSION)" || { echo "no github.com/cri-o/cri-o require line in hack/crio/go.mod" >&2; exit 1; }
	@mkdir -p $(CRIO_BIN)
	cd hack/crio && GOWORK=off CGO_ENABLED=0 $(GO) build -trimpath -tags '$(CRIO_TAGS)' -ldflags '-s -w' -o $(CRIO_BIN)/ github.com/cri-o/cri-o/cmd/crio
	src=$$(cd hack/crio && GOWORK=off $(GO) list -m -f '{{.Dir}}' github.com/cri-o/cri-o) && \
		cc -std=c99 -Os -Wall -Werror -Wextra -static -s -o $(CRIO_BIN)/pinns $$src/pinns/src/*.c
	@rm -f $(CRIO_BIN)/.built-* && touch $@

## consumer-spring: build the Spring Boot sample consumer's jar with Maven into
## examples/consumer-spring/target (ignored); warm runs do nothing, a source change rebuilds
# Cold (an empty ~/.m2) about 30 s, a rebuild offline about 15 s. Under
# CI=true a failed build fails; elsewhere the Spring tests skip without it.
SPRING_DIR := examples/consumer-spring
SPRING_JAR := $(SPRING_DIR)/target/consumer-spring.jar
consumer-spring: $(SPRING_JAR)
$(SPRING_JAR): $(SPRING_DIR)/pom.xml $(shell find $(SPRING_DIR)/src -type f 2>/dev/null) hack/consumer-spring/build.sh
	@bash hack/consumer-spring/build.sh

## consumer-nats-python: install nats-py (pinned) for the Python sample NATS consumer into
## examples/consumer-nats-python/pylib (ignored); warm runs do nothing
## consumer-nats-node: install nats.js (pinned by package.json and its lockfile) into
## examples/consumer-nats-node/node_modules (ignored); warm runs do nothing
# Each about 1-2 s cold. Under CI=true a failed install fails; elsewhere the
# tests that need the client skip.
NATS_PY_VERSION := 2.16.0
NATS_PY_STAMP   := examples/consumer-nats-python/pylib/.installed-nats-py-$(NATS_PY_VERSION)
NATS_NODE_DIR   := examples/consumer-nats-node
NATS_NODE_STAMP := $(NATS_NODE_DIR)/node_modules/.ms2m-installed
consumer-nats-python: $(NATS_PY_STAMP)
$(NATS_PY_STAMP): hack/consumer-nats/install.sh
	@bash hack/consumer-nats/install.sh python $(NATS_PY_VERSION)
consumer-nats-node: $(NATS_NODE_STAMP)
$(NATS_NODE_STAMP): $(NATS_NODE_DIR)/package.json $(NATS_NODE_DIR)/package-lock.json hack/consumer-nats/install.sh
	@bash hack/consumer-nats/install.sh node

## criu: install CRIU >= 4.2 privately into bin/criu (bin/criu/criu; about 10 s once, then a quick check)
criu:
	@bash hack/install-criu.sh $(CRIU_DIR)

## node-setup: install Debian's runc, CNI plugins, iproute2 and nftables for a real node (idempotent)
node-setup:
	@bash hack/setup.sh node

## images: build every image (static binaries on an empty base, no Docker) into out/images; ms2m's own (sidecar, webhook, migrator) for each of PLATFORMS, as one image index
IMAGES_DIR ?= out/images
IMAGE_TAG  ?= dev
REGISTRY   ?= 127.0.0.1:5000
PLATFORMS  ?= linux/amd64,linux/arm64
images:
	$(GO) run ./hack/images build -o $(IMAGES_DIR) -tag $(IMAGE_TAG) -platforms $(PLATFORMS)

## push: push the built images to REGISTRY (host:port) over plain HTTP
push: images
	$(GO) run ./hack/images push -registry $(REGISTRY) -insecure -from $(IMAGES_DIR)

## registry: serve an image registry on REGISTRY with data in out/registry until SIGTERM
registry:
	$(GO) build -o $(BIN)/images ./hack/images
	$(BIN)/images registry -addr $(REGISTRY) -dir out/registry

## fuzz: run every fuzz target for FUZZTIME each (default 30s)
FUZZTIME ?= 30s
fuzz:
	@for t in $$($(GO) test -list '^Fuzz' ./internal/amqpwire/ | grep ^Fuzz); do \
		$(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) ./internal/amqpwire/ || exit 1; done
	@for t in $$($(GO) test -list '^Fuzz' ./internal/shadowqueue/ | grep ^Fuzz); do \
		$(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) ./internal/shadowqueue/ || exit 1; done
	@for t in $$($(GO) test -list '^Fuzz' ./internal/natswire/ | grep ^Fuzz); do \
		$(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) ./internal/natswire/ || exit 1; done

## demo: six real migrations of an unmodified consumer from node 1 to node 2 of a
## local cluster while a producer sends, one per strategy (stop-and-copy, ms2m,
## ms2m-cutoff of a Deployment's pod; statefulset, statefulset-shadow of a
## StatefulSet's), then ms2m of a NATS JetStream consumer, each checked against
## the producer's hash; prints a table
## (times, messages lost and duplicated, hash) and takes the cluster down.
## DEMOFLAGS passes flags, e.g. DEMOFLAGS='-keep -rate 15' (see go run ./hack/demo -h).
## A first run builds the cluster's binaries: 10-20 minutes on 2 cores.
DEMOFLAGS ?=
demo:
	@test -f $(K8S_STAMP) && test -f $(NODE_STAMP) && test -f $(CONTAINERD_STAMP) && test -x $(CRIU_DIR)/criu || \
		echo "demo: first run: building kube-apiserver, etcd, the kubelet, controller-manager, scheduler and containerd from source and installing CRIU; this takes 10-20 minutes on 2 cores, once (later runs reuse them)"
	@$(MAKE) -j1 --no-print-directory setup node-setup k8s-bin node-bin criu
	@echo "demo: compiling and starting hack/demo"
	$(GO) run ./hack/demo $(DEMOFLAGS)

## demo-sidecar: the sidecar alone on this host, no cluster (about 20 s): state,
## quiesce and resume, then a live handoff to a target sidecar in replay mode, with the hash check
.PHONY: demo-sidecar
demo-sidecar: setup build
	@bash hack/demo.sh

vet:
	$(GO) vet ./...
	cd $(BENCH_MOD) && GOWORK=off $(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)

clean:
	rm -rf $(BIN) out

## helm-bin: build the helm command line into bin/helm from the Go module pinned in hack/helm (once; warm runs do nothing)
# About 3 minutes cold on 2 cores. The stamp names the version, so a bump of
# helm.sh/helm/v4 in hack/helm/go.mod rebuilds.
HELM_VERSION := $(shell awk '$$1 == "helm.sh/helm/v4" {print $$2}' hack/helm/go.mod)
HELM_STAMP   := $(CURDIR)/$(BIN)/.helm-built-$(HELM_VERSION)
.PHONY: helm-bin chart-test
helm-bin: $(HELM_STAMP)
$(HELM_STAMP): hack/helm/go.mod hack/helm/go.sum
	@test -n "$(HELM_VERSION)" || { echo "no helm.sh/helm/v4 require line in hack/helm/go.mod" >&2; exit 1; }
	@mkdir -p $(BIN)
	cd hack/helm && GOWORK=off CGO_ENABLED=0 $(GO) build -trimpath \
		-ldflags '-s -w -X helm.sh/helm/v4/internal/version.version=$(HELM_VERSION)' \
		-o $(CURDIR)/$(BIN)/helm helm.sh/helm/v4/cmd/helm
	@rm -f $(BIN)/.helm-built-* && touch $@

## chart-test: the Helm chart's tests (hack/helm/charttest): SDK renders, helm lint and template,
## bad values refused, every object applied to a real kube-apiserver, RBAC checked, the webhook run as installed
chart-test: export KUBEBUILDER_ASSETS := $(K8S_BIN)
chart-test: helm-bin k8s-bin
	cd hack/helm && GOWORK=off $(GO) vet ./... && GOWORK=off $(GO) test $(GOFLAGS) -count=1 -timeout 10m ./charttest/

## lint-bin: build golangci-lint into bin/golangci-lint from the Go module pinned in hack/lint (once; warm runs do nothing)
# The stamp names the version, so a bump of golangci-lint in hack/lint/go.mod
# rebuilds; nothing else does (a fresh checkout's newer go.mod, say, in a
# worktree that shares bin/). Built from source like helm: no prebuilt
# binary is downloaded.
LINT_VERSION := $(shell awk '$$1 == "require" && $$2 == "github.com/golangci/golangci-lint/v2" {print $$3} $$1 == "github.com/golangci/golangci-lint/v2" {print $$2}' hack/lint/go.mod | head -1)
LINT_STAMP   := $(CURDIR)/$(BIN)/.golangci-lint-built-$(LINT_VERSION)
.PHONY: lint-bin lint
lint-bin: $(LINT_STAMP)
$(LINT_STAMP):
	@test -n "$(LINT_VERSION)" || { echo "no github.com/golangci/golangci-lint/v2 require line in hack/lint/go.mod" >&2; exit 1; }
	@mkdir -p $(BIN)
	cd hack/lint && GOWORK=off CGO_ENABLED=0 $(GO) build -trimpath \
		-ldflags '-s -w -X main.version=$(patsubst v%,%,$(LINT_VERSION)) -X main.commit=hack/lint -X main.date=unknown' \
		-o $(CURDIR)/$(BIN)/golangci-lint github.com/golangci/golangci-lint/v2/cmd/golangci-lint
	@rm -f $(BIN)/.golangci-lint-built-* && touch $@

## lint: golangci-lint with .golangci.yml over the main module and the benchmarks' module
## (hack/bench); the tools modules in hack/helm, hack/k8s, hack/containerd and hack/lint
## are modules of their own and are not linted
lint: lint-bin
	$(BIN)/golangci-lint run ./...
	cd $(BENCH_MOD) && GOWORK=off $(CURDIR)/$(BIN)/golangci-lint run --config $(CURDIR)/.golangci.yml ./...
