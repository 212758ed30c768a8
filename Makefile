# cairn — the two commands: `make demo` and `make test`.
# Cargo's target directory may be shared with CI's cache: export CARGO_TARGET_DIR to reuse it.

CARGO ?= cargo
SHELL := /bin/bash

.PHONY: demo policy test test-fast lint crds crds-check fmt

## The whole system on this machine, no Docker: installs what the demo uses and is missing
## (nginx, moto, helm, the control plane and a node built from Go modules), builds the
## workspace's binaries and their images, starts the control plane, a real node, S3 and
## cairn-sim behind nginx, helm-installs cairn onto the node, drives an AgentSession through
## each compaction level and a 413 recovery, prints its status, tears everything down. Every
## step prints its elapsed seconds (tests/harness/demo.sh). DEMO_FLAGS=--keep leaves it up;
## DEMO_FLAGS=--kwok uses kwok's node.
demo:
	CARGO=$(CARGO) bash tests/harness/demo.sh $(DEMO_FLAGS)

## Print a session's effective compaction policy (defaults <- CompactionPolicy <- inline).
policy:
	$(CARGO) run -q -p cairn-agent -- policy \
	  --session charts/cairn/examples/agentsession.yaml \
	  --policy charts/cairn/examples/compactionpolicy.yaml

## Every test: unit, property, integration, the cluster suites and the end-to-end demo
## (the binaries are built first: the harness runs them as pods). First, once per machine,
## the previous release the upgrade test installs (tests/harness/build-release.sh: its
## dependencies compiled once with today's, in the workspace's build directory; today's own
## crates are rebuilt after it, which is why it comes before the build). The unit tests of every
## crate run first, so a failure there shows in minutes; then every other test target
## (integration, bench and binary targets: `cargo test --workspace --bins --test '*'
## --bench '*' --examples`) runs in three lanes side by side, the llama.cpp lane, the real-node
## lane and the rest, with each target's time (tests/harness/test-lanes.py). Every target runs
## even when one failed, and the command fails if any did.
test:
	CARGO_TARGET_DIR=$${CARGO_TARGET_DIR:-$(CURDIR)/target} \
	  bash tests/harness/build-release.sh "$$(cat tests/harness/previous-release)" >/dev/null
	$(CARGO) build -q --workspace --bins
	$(CARGO) test --workspace --lib --no-fail-fast; unit=$$?; \
	CARGO=$(CARGO) python3 tests/harness/test-lanes.py; rest=$$?; \
	exit $$(( unit | rest ))

## The fast tier for iteration: every crate's unit tests and the engine's suite (no servers,
## no cluster).
test-fast:
	$(CARGO) test --workspace --lib
	$(CARGO) test -p cairn-engine --test engine

## Static checks CI runs before the tests.
lint: fmt crds-check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all -- --check

## Regenerate the committed CRD YAML (crds/generated/ and the chart).
crds:
	$(CARGO) run -q -p cairn-crds --bin crdgen

## Fail when the committed CRD YAML differs from the types.
crds-check:
	$(CARGO) run -q -p cairn-crds --bin crdgen -- --check
