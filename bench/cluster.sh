#!/usr/bin/env bash
# Cluster-mode benchmark: wordcount and GroupByKey on one Weir process vs
# three worker processes on this machine (bench/cluster_bench.py --help).
#
#   bench/cluster.sh [--copies N] [--gbk-records N] [--rounds N] [--only wordcount|gbk]
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ "${WEIR_SKIP_SETUP:-0}" = 1 ] || bash "$REPO/scripts/setup.sh"
cd "$REPO/bench"
exec "$REPO/.venv/bin/python" "$REPO/bench/cluster_bench.py" "$@"
