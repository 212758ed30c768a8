# cairn — the two commands: `make demo` and `make test`.
# Cargo's target directory may be shared with CI's cache: export CARGO_TARGET_DIR to reuse it.

CARGO ?= cargo
SHELL := /bin/bash

.PHONY: demo test unit lint crds crds-check fmt

## Run the simplest end-to-end thing on an embedded default: resolve the example session's
## effective compaction policy (defaults ← CompactionPolicy ← inline) and print it with its hash.
demo:
	$(CARGO) run -q -p cairn-agent -- policy \
	  --session charts/cairn/examples/agentsession.yaml \
	  --policy charts/cairn/examples/compactionpolicy.yaml

## Every test: unit, property and integration.
test:
	$(CARGO) test --workspace --all-targets --no-fail-fast

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
