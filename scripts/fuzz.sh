#!/usr/bin/env bash
# Fuzzes Weir: mutations of the captured Python, Java and Go pipelines
# (tests/fuzz/seeds, crates/plan/tests/fixtures) and of Job API requests,
# against the planner in-process and against a live `weir serve`, both at
# once for SECS seconds (default 3600: the long run; CI runs 100).
#
#   scripts/fuzz.sh [SECS] [RNG_SEED]
#
# Fails if any case panics, aborts or hangs the planner or the server, or is
# refused with anything but a named INVALID_ARGUMENT or UNIMPLEMENTED (or, at
# the server, the operator policy's PERMISSION_DENIED or RESOURCE_EXHAUSTED); the
# failing cases are saved under target/fuzz-failures/ (replay one with
# `target/release/weir-fuzz planner --seeds DIR` on a folder holding it).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
SECS="${1:-3600}"
SEED="${2:-$(date +%s)}"
if ! command -v cargo >/dev/null 2>&1; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
cargo build --release -q -p weir -p weir-fuzz
FUZZ=target/release/weir-fuzz
"$FUZZ" planner --secs "$SECS" --seed "$SEED" --out target/fuzz-failures/planner &
planner=$!
"$FUZZ" server --secs "$SECS" --seed "$((SEED + 1))" --weir target/release/weir --out target/fuzz-failures/server &
server=$!
status=0
wait $planner || status=1
wait $server || status=1
exit $status
