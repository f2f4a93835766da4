#!/usr/bin/env bash
# Beam's own Python load tests (apache_beam.testing.load_tests: GBK, Combine,
# ParDo, side input (iter, dict), CoGBK) on the synthetic source, each under
# Weir (PROCESS environment, `weir boot`) and under DirectRunner
# (multi_processing, 2 workers). Prints per test wall times, their ratio and
# ok/FAILED on each runner (with the first error line of each failure); exits 1
# if any run failed. Logs: bench/data/out/load_tests/<test>/<runner>/.
#
#   bench/load_tests.sh [--records N] [--only weir|direct] [--tests gbk,cogbk,...]
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$REPO/scripts/setup.sh"
exec "$REPO/.venv/bin/python" "$REPO/bench/load_tests.py" "$@"
