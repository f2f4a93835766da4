#!/usr/bin/env bash
# Weir's full test run (what CI runs): build + venv, the Rust tests, the
# Java runner's unit tests (java/src/test), the
# end-to-end tests (Python, Java, Go pipelines) against target/release/weir,
# and Beam's conformance suites listed in the ledgers: Python PrismRunnerTest
# (conformance/ledger.txt), Java ValidatesRunner (conformance/java_ledger.txt),
# Go integration tests (conformance/go_ledger.txt). Exits non-zero if any
# part fails; every part runs even when an earlier one failed.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

bash scripts/setup.sh
if ! command -v cargo >/dev/null 2>&1; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi

failed=()
step() {
  local name="$1"
  shift
  echo
  echo "=== $name: $*"
  local began=$SECONDS
  if "$@"; then
    echo "=== $name: OK in $((SECONDS - began)) s"
  else
    echo "=== $name: FAILED (exit $?) after $((SECONDS - began)) s"
    failed+=("$name")
  fi
}

step "cargo test" cargo test --release --workspace
step "fuzz (short run)" bash scripts/fuzz.sh 100
step "java unit tests" mvn -B -q -f java/pom.xml test
step "e2e tests" .venv/bin/python -m pytest -p no:cacheprovider --timeout=900 -rfEs tests/e2e
step "conformance ledger (Python)" bash conformance/run.sh ledger
step "conformance ledger (Java)" bash conformance/java.sh ledger
step "conformance ledger (Go)" bash conformance/go.sh ledger

echo
if [ "${#failed[@]}" -gt 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "all test steps passed"
