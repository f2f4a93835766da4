#!/usr/bin/env bash
# Prepares Weir's Go test drivers (go/): downloads the Go modules (Beam Go SDK
# v2.77.0 and what it needs, into the module cache, ~/go/pkg/mod by default)
# and builds into go/bin/:
#   wordcount          the Go wordcount of tests/e2e/test_go.py (go/cmd/wordcount)
#   beam-go-boot       Beam's own Go container boot program
#                      (github.com/apache/beam/sdks/v2/go/container): the
#                      PROCESS environment's command for Go pipelines
#   primitives.test    Beam's Go integration tests, compiled (go test -c) from
#   wordcount.test     github.com/apache/beam/sdks/v2/go/test/integration/...;
#   synthetic.test     conformance/go.sh runs them against Weir
# Idempotent: a second run with nothing changed (go.mod, go.sum, go/**.go, the
# Go version) only checks a stamp. Needs Go >= 1.26 (`go` on PATH, or
# /usr/local/go/bin/go); scripts/setup.sh calls it unless WEIR_SKIP_GO=1.
#
# Environment: WEIR_GO_FORCE=1 rebuilds even when the stamp matches.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GODIR="$REPO/go"
BIN="$GODIR/bin"
STAMP="$BIN/.weir-go-build.sha256"

say() { printf '[setup_go] %s\n' "$*" >&2; }
die() { printf '[setup_go] ERROR: %s\n' "$*" >&2; exit 1; }

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH="/usr/local/go/bin:$PATH"
fi
command -v go >/dev/null 2>&1 || die "go not found; install Go 1.26+ (https://go.dev/dl) and re-run"

export GOFLAGS="${GOFLAGS:--mod=mod}"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
cd "$GODIR"

want="$({ go version; cat go.mod go.sum; find . -name '*.go' -not -path './bin/*' | sort | xargs cat; } | sha256sum | cut -d' ' -f1)"
have="$(cat "$STAMP" 2>/dev/null || true)"
binaries=(wordcount beam-go-boot primitives.test wordcount.test synthetic.test)
all_there=1
for b in "${binaries[@]}"; do [ -x "$BIN/$b" ] || all_there=0; done
if [ "$want" = "$have" ] && [ "$all_there" = 1 ] && [ "${WEIR_GO_FORCE:-0}" != 1 ]; then
  say "Go drivers up to date ($STAMP)"
  exit 0
fi

start=$(date +%s)
say "go mod download (module cache: $(go env GOMODCACHE))"
go mod download
mkdir -p "$BIN"
# Stripped (-s -w): the PROCESS environment stages the worker binary through
# the artifact API for every job, so size is time.
LDFLAGS='-s -w'
INTEGRATION=github.com/apache/beam/sdks/v2/go/test/integration
say "go build: wordcount, beam-go-boot"
go build -ldflags="$LDFLAGS" -o "$BIN/wordcount" ./cmd/wordcount
go build -ldflags="$LDFLAGS" -o "$BIN/beam-go-boot" github.com/apache/beam/sdks/v2/go/container
for p in primitives wordcount synthetic; do
  say "go test -c $INTEGRATION/$p"
  go test -c -ldflags="$LDFLAGS" -o "$BIN/$p.test" "$INTEGRATION/$p"
done
printf '%s\n' "$want" > "$STAMP"
say "ready: $BIN ($(( $(date +%s) - start )) s)"
