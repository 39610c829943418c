# agentjail: build, run and test.
#
#   make run     set up the host, build, and start the daemon on its defaults
#                (data dir /var/lib/agentjail, http://127.0.0.1:8082, host rootfs)
#   make test    set up the host, build, check formatting and vet, run every test
#   make bench   run the end-to-end benchmarks and print a table
#   make soak    run the long reliability tests (10 000 create/exec/destroy cycles)
#
# Everything runs as root (the daemon makes mounts, loop devices, cgroups and
# network namespaces). CI=true makes privileged tests fail instead of skip.

SHELL := /bin/bash
export PATH := /usr/local/sbin:/usr/local/go/bin:$(PATH)
export CGO_ENABLED := 0

BIN        := bin/agentjail
GO         ?= go
BENCHTIME  ?= 20x
# The Go files to check: git's view (tracked and new, not ignored), else all.
GOFILES     = $(or $(wildcard $(shell git ls-files --cached --others --exclude-standard '*.go' 2>/dev/null)),.)

.PHONY: all setup gvisor kube-bins build kube run test fuzz fmt-check vet staticcheck lint bench soak web-vendor clean

all: build

## setup: install the host packages, CRIU >= 4.1, runsc, and check Go (idempotent)
setup:
	@scripts/setup.sh

## gvisor: build runsc (the gvisor level's runtime) from the gVisor Go
## module at the version go.mod pins, into /usr/local/sbin (idempotent;
## setup runs it too)
gvisor:
	@scripts/build-runsc.sh

## kube-bins: kube-apiserver, kube-scheduler, kubectl and helm for the tests
## of kube/, built from Go modules once per version (scripts/build-kube.sh)
kube-bins:
	@scripts/build-kube.sh

## build: the static binary at bin/agentjail
build:
	$(GO) build -trimpath -o $(BIN) ./cmd/agentjail

## kube: the Kubernetes node agent, operator and gateway at bin/agentjail-kube,
## beside bin/agentjail (serve --kube-node runs it; docs/kubernetes.md)
kube:
	cd kube && $(GO) build -trimpath -o ../bin/agentjail-kube ./cmd/agentjail-kube

## run: start the daemon in the foreground on its defaults
run: setup build
	exec ./$(BIN) serve

## test: formatting, vet, staticcheck and the whole test suite (unit + end-to-end),
## then every fuzz target for FUZZTIME. The packages run one at a time: they
## share host-wide state (a mount namespace made by one copies the others'
## mounts and pins them; interfaces, routes and nftables tables are the host's).
test: setup kube-bins build fmt-check vet staticcheck
	$(GO) test -count=1 -p 1 -timeout 60m ./...
	cd kube && $(GO) test -count=1 -p 1 -timeout 30m ./...
	@GO=$(GO) FUZZTIME=$(FUZZTIME) scripts/fuzz.sh

## fuzz: run every fuzz target (go test -fuzz) for FUZZTIME each; FUZZ=regexp
## picks targets. An input that fails is kept under its package's
## testdata/fuzz/ (commit it with the fix: it becomes a regression test that
## every go test runs).
FUZZTIME ?= 5s
fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) FUZZ='$(FUZZ)' scripts/fuzz.sh

fmt-check:
	@out=$$(gofmt -l $(GOFILES)); \
	if [ -n "$$out" ]; then echo "gofmt needs to be run on:"; echo "$$out"; exit 1; fi

## vet: both modules (the Kubernetes parts are the module under kube/, so
## that the daemon does not link Kubernetes' libraries)
vet:
	$(GO) vet ./...
	cd kube && $(GO) vet ./...

## staticcheck: honnef.co/go/tools at the version go.mod pins (a tool
## dependency: go tool builds it)
staticcheck:
	$(GO) tool staticcheck ./...
	$(GO) build -o bin/staticcheck honnef.co/go/tools/cmd/staticcheck
	cd kube && ../bin/staticcheck ./...

## lint: gofmt, go vet, staticcheck and a syntax check of the shell scripts
lint: fmt-check vet staticcheck
	@for f in scripts/*.sh .ci/run; do bash -n "$$f" || exit 1; done
	@if command -v shellcheck >/dev/null; then shellcheck scripts/*.sh .ci/run; fi

## bench: end-to-end benchmarks against the real daemon, the network policy
## path and init's exec path (one package at a time, so that they do not
## compete for the CPUs), as a table; then the kernel-side tracer's
## numbers (traced vs untraced vs strace, events/s, host cost per syscall)
bench: setup kube-bins build
	@set -o pipefail; \
	$(GO) test -count=1 -p 1 -timeout 60m -run '^$$' -bench . -benchtime $(BENCHTIME) \
		./test/integration/ ./internal/netpolicy/ ./internal/initclient/ ./internal/api/ \
		| tee /dev/stderr | scripts/benchtable.sh
	@set -o pipefail; AGENTJAIL_BENCH=1 $(GO) test -count=1 -timeout 30m -run 'Bench' -v ./internal/observe/bpf/ \
		| grep -v '^=== RUN'
	$(GO) test -count=1 -run '^$$' -bench Pipeline ./internal/observe/bpf/
	@set -o pipefail; cd kube && $(GO) test -count=1 -timeout 30m -run '^$$' -bench . -benchtime 5x ./e2e/ \
		| tee /dev/stderr | ../scripts/benchtable.sh

## soak: the long reliability runs of test/integration: TestSoak with
## SOAK_CYCLES create/exec/destroy cycles (make test runs 500), the leak
## inventory and the daemon's RSS and descriptors checked flat; and
## TestNoisyNeighbour (a jail's exec p99 beside a fork bomb, a memory hog,
## a disk filler and fd exhaustion); and TestCrash with CRASH_ROUNDS rounds
## of daemon kills (make test runs 1). Other long runs join SOAK_TESTS (a go
## test -run pattern).
SOAK_CYCLES  ?= 10000
CRASH_ROUNDS ?= 20
SOAK_TESTS   ?= ^(TestSoak|TestNoisyNeighbour|TestCrash)$$
soak: setup build
	AGENTJAIL_NOISY=1 AGENTJAIL_SOAK_CYCLES=$(SOAK_CYCLES) AGENTJAIL_CRASH_ROUNDS=$(CRASH_ROUNDS) \
		$(GO) test -count=1 -p 1 -timeout 0 -run '$(SOAK_TESTS)' -v ./test/integration/

## web-vendor: copy the console's browser libraries (xterm.js, asciinema-player)
## from the npm packages pinned in web/package-lock.json into web/static/vendor
## (committed: a build needs no npm)
web-vendor:
	scripts/web-vendor.sh

clean:
	rm -rf bin
