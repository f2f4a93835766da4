#!/usr/bin/env bash
# Runs every benchmark and collects their results:
#   wordcount   bench/wordcount_bench.py (bench/run.sh): Python wordcount, Weir PROCESS vs DirectRunner
#               and Prism, medians of 3 interleaved rounds
#   load_tests  bench/load_tests.py: Beam's Python load tests, Weir PROCESS vs DirectRunner, Weir vs Prism
#               LOOPBACK, medians of 3 interleaved rounds
#   load_tests_1m  the same at 1M records (gbk, combine, pardo, sideinput_iter; not with --quick)
#   gbk         bench/gbk_bench.py: GroupByKey scaling, Weir vs Prism vs DirectRunner
#   polyglot    bench/polyglot_bench.py: Go and Java wordcount, Weir vs Prism
#   polyglot_direct  the same on one copy of the plays (5.3 MB), Weir vs Prism vs
#               each SDK's DirectRunner, 2 rounds (Java's takes about 4 minutes a round even so; Go
#               only with --quick)
#   latency     bench/latency.py: streaming GroupByKey element-to-pane latency, Weir vs Prism
#   trivial     bench/trivial.py: Create|Map fixed cost, Weir LOOPBACK/PROCESS vs Prism vs DirectRunner
#   cluster     bench/cluster_bench.py: wordcount and GroupByKey, 1 Weir process vs 3 worker processes
# each with --json bench/out/NAME.json (its printed table in bench/out/NAME.txt,
# its progress log in bench/out/NAME.log), then writes bench/out/summary.md
# and bench/out/ratios.png (bench/summary.py). A benchmark that fails is
# marked FAILED in the summary and the others still run; the exit status is 1
# if any failed.
#
#   bench/all.sh [--quick] [--only a,b] [--skip a,b] [--no-setup]
#                [--weir-bin PATH] [--venv DIR] [--prism-bin PATH]
#
# --quick      tiny sizes (1 copy of the plays and 2,000 load-test records, 2
#              rounds each; 20k GBK records, 5 s of latency, 3 trivial rounds):
#              a few minutes in all
# --no-setup   don't run scripts/setup.sh (use the binary, venv, go/bin and
#              java/target that are there); --weir-bin (or $WEIR_BIN) alone
#              runs it with WEIR_SKIP_BUILD=1 (no cargo build)
# --venv DIR   the Python venv with apache-beam (default .venv, or $WEIR_VENV)
# --prism-bin  Prism's binary (default bench/bin/prism, built there once from
#              Beam's Go module cmd/prism@v2.77.0 when missing)
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$REPO/bench/out"
QUICK=0
SETUP=1
ONLY=""
SKIP=""
WEIR="${WEIR_BIN:-}"
VENV="${WEIR_VENV:-$REPO/.venv}"
PRISM="${PRISM_BIN:-}"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --no-setup) SETUP=0 ;;
    --only) ONLY="$2"; shift ;;
    --only=*) ONLY="${1#*=}" ;;
    --skip) SKIP="$2"; shift ;;
    --skip=*) SKIP="${1#*=}" ;;
    --weir-bin) WEIR="$2"; shift ;;
    --weir-bin=*) WEIR="${1#*=}" ;;
    --venv) VENV="$2"; shift ;;
    --venv=*) VENV="${1#*=}" ;;
    --prism-bin) PRISM="$2"; shift ;;
    --prism-bin=*) PRISM="${1#*=}" ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

say() { printf '[all] %s\n' "$*" >&2; }

if [ "$SETUP" = 1 ]; then
  if [ -n "$WEIR" ]; then
    WEIR_SKIP_BUILD=1 bash "$REPO/scripts/setup.sh" || exit 1
  else
    bash "$REPO/scripts/setup.sh" || exit 1
  fi
fi
WEIR="$(realpath "${WEIR:-$REPO/target/release/weir}")"
PY="$VENV/bin/python"
[ -x "$WEIR" ] || { say "missing $WEIR (run scripts/setup.sh or pass --weir-bin)"; exit 1; }
[ -x "$PY" ] || { say "missing $PY (run scripts/setup.sh or pass --venv)"; exit 1; }

# matplotlib for the chart, once per change of bench/requirements.txt.
REQ="$REPO/bench/requirements.txt"
STAMP="$VENV/.weir-bench-requirements.sha256"
want="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [ "$want" != "$(cat "$STAMP" 2>/dev/null || true)" ]; then
  say "pip install -r bench/requirements.txt into $VENV"
  if "$PY" -m pip install --disable-pip-version-check -q -r "$REQ"; then
    printf '%s\n' "$want" > "$STAMP"
  else
    say "pip install failed: the summary will have no chart"
  fi
fi

if [ -z "$PRISM" ]; then
  PRISM="$REPO/bench/bin/prism"
  if [ ! -x "$PRISM" ]; then
    say "building Prism (github.com/apache/beam/sdks/v2/go/cmd/prism@v2.77.0) into bench/bin"
    GOBIN="$REPO/bench/bin" GOTOOLCHAIN=local go install \
      github.com/apache/beam/sdks/v2/go/cmd/prism@v2.77.0 || say "Prism build failed"
  fi
fi
PRISM="$(realpath -m "$PRISM")"

if [ "$QUICK" = 1 ]; then
  WORDCOUNT=(--copies 1 --rounds 2)
  LOAD=(--records 2000 --rounds 2)
  GBK=(--sizes 20000)
  POLY=(--copies 1 --rounds 1)
  POLY_DIRECT=(--copies 1 --rounds 1 --only go)
  LAT=(--seconds 5)
  TRIV=(--rounds 3)
  CLUSTER=(--copies 1 --gbk-records 20000 --rounds 1)
else
  WORDCOUNT=(--rounds 3)
  LOAD=(--rounds 3)
  LOAD_1M=(--records 1000000 --tests gbk,combine,pardo,sideinput_iter --timeout 900)
  GBK=()
  POLY=()
  POLY_DIRECT=(--copies 1 --rounds 2)
  LAT=(--seconds 20 --rounds 2)
  TRIV=(--rounds 5)
  CLUSTER=(--rounds 2)
fi

mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/summary.md "$OUT"/ratios.png
STATUS=()
FAILED=0
wanted() {
  if [ -n "$ONLY" ] && [[ ",$ONLY," != *",$1,"* ]]; then return 1; fi
  if [[ ",$SKIP," == *",$1,"* ]]; then return 1; fi
  return 0
}
run() {
  local name="$1"; shift
  if ! wanted "$name"; then
    STATUS+=(--status "$name=skipped")
    return
  fi
  say "$name: $*"
  local start=$SECONDS
  (cd "$REPO/bench" && "$PY" "$@" --json "$OUT/$name.json") >"$OUT/$name.txt" 2>"$OUT/$name.log"
  local rc=$?
  cat "$OUT/$name.txt"
  if [ $rc = 0 ]; then
    STATUS+=(--status "$name=ok")
    say "$name: ok in $((SECONDS - start)) s"
  else
    STATUS+=(--status "$name=FAILED (exit $rc)")
    FAILED=1
    say "$name: FAILED (exit $rc) after $((SECONDS - start)) s; end of $OUT/$name.log:"
    tail -n 15 "$OUT/$name.log" >&2
  fi
}

B="$REPO/bench"
run wordcount "$B/wordcount_bench.py" --weir-bin "$WEIR" --prism-bin "$PRISM" "${WORDCOUNT[@]}"
run load_tests "$B/load_tests.py" --weir-bin "$WEIR" --prism-bin "$PRISM" "${LOAD[@]}"
if [ "$QUICK" = 1 ]; then
  STATUS+=(--status "load_tests_1m=skipped (--quick)")
else
  run load_tests_1m "$B/load_tests.py" --weir-bin "$WEIR" --prism-bin "$PRISM" \
    --out-dir "$B/data/out/load_tests_1m" "${LOAD_1M[@]}"
fi
run gbk "$B/gbk_bench.py" --weir-bin "$WEIR" --prism-bin "$PRISM" "${GBK[@]}"
run polyglot "$B/polyglot_bench.py" --weir-bin "$WEIR" --prism-bin "$PRISM" "${POLY[@]}"
run polyglot_direct "$B/polyglot_bench.py" --weir-bin "$WEIR" --prism-bin "$PRISM" \
  --runners weir,prism,direct "${POLY_DIRECT[@]}"
run latency "$B/latency.py" --weir-bin "$WEIR" --prism-bin "$PRISM" "${LAT[@]}"
run trivial "$B/trivial.py" --weir-bin "$WEIR" --prism-bin "$PRISM" "${TRIV[@]}"
run cluster "$B/cluster_bench.py" --weir-bin "$WEIR" "${CLUSTER[@]}"

NOTE="$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end; weir $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')"
[ "$QUICK" = 1 ] && NOTE="$NOTE; --quick sizes (tiny inputs: fixed costs dominate)"
"$PY" "$B/summary.py" "$OUT" --note "$NOTE" "${STATUS[@]}" || FAILED=1
say "wrote $OUT/summary.md and $OUT/ratios.png"
exit $FAILED
