#!/usr/bin/env bash
# GroupByKey scaling benchmark (200k, 1M, 2M records) on Weir, Prism and
# DirectRunner, interleaved; runner CPU per record, RSS and ratios. See
# bench/gbk_bench.py for the pipeline and options.
#
#   bench/gbk.sh [--sizes 200000,1000000,2000000] [--runners weir,prism,direct]
#                [--weir-flag=--gbk_memory_budget_mb=8]
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$REPO/scripts/setup.sh"
exec "$REPO/.venv/bin/python" "$REPO/bench/gbk_bench.py" "$@"
