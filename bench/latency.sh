#!/usr/bin/env bash
# Streaming latency benchmark: element-to-pane latency through a streaming
# GroupByKey (PeriodicImpulse at 1,000 elements/s, GlobalWindows,
# Repeatedly(AfterCount(1)), DISCARDING) on Weir and Prism, LOOPBACK,
# interleaved rounds; prints count, p50, p99, max per runner and fails if a
# runner loses or repeats elements. Target for Weir: p99 < 50 ms. See
# bench/latency.py.
#
#   bench/latency.sh [--seconds 20] [--rate 1000] [--keys 4] [--rounds 1]
#                    [--runners weir,prism] [--json PATH]
#
# WEIR_BENCH_NO_SETUP=1 skips scripts/setup.sh (use the binary and venv there).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "${WEIR_BENCH_NO_SETUP:-0}" != "1" ]; then
  bash "$REPO/scripts/setup.sh"
fi
if [ ! -x "$REPO/bench/bin/prism" ] && [ ! -x /work/prism-bin/prism ]; then
  echo "[bench] building Prism (github.com/apache/beam/sdks/v2/go/cmd/prism@v2.77.0) into bench/bin" >&2
  GOBIN="$REPO/bench/bin" GOTOOLCHAIN=local go install github.com/apache/beam/sdks/v2/go/cmd/prism@v2.77.0
fi
exec "$REPO/.venv/bin/python" "$REPO/bench/latency.py" "$@"
