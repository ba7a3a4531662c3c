# ms2m — see README.md. Every target prepares what it needs itself.
GO      ?= go
GOFLAGS ?=
BIN     := bin
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: all build test test-unit setup bench fuzz demo vet clean

all: build

## build: compile every binary into bin/
build:
	$(GO) build $(GOFLAGS) -o $(BIN)/ ./cmd/... ./examples/consumer ./examples/producer

## setup: prepare the broker, its stream plugin, a test user and python3-pika (idempotent)
setup:
	@bash hack/setup.sh

## test: the whole suite against the real broker and real clients (CI runs this)
test: setup
	$(GO) vet ./...
	$(GO) test $(GOFLAGS) -count=1 -timeout 25m ./...

## test-unit: only the tests that need no broker
test-unit:
	$(GO) test $(GOFLAGS) -count=1 -short ./...

## bench: direct against through-the-sidecar, side by side; writes BENCHMARKS.md figures to stdout
bench: setup build
	$(GO) run ./hack/bench $(BENCHFLAGS)

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
