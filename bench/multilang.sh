#!/usr/bin/env bash
# Multi-language benchmark: Java GenerateSequence -> Python Map -> count (1M
# elements) on Weir vs the same transforms in Python alone; prints wall time
# and CPU per environment. See bench/multilang_bench.py.
#
#   bench/multilang.sh [--n N] [--rounds R]
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$REPO/scripts/setup.sh"
exec "$REPO/.venv/bin/python" "$REPO/bench/multilang_bench.py" "$@"
