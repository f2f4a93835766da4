#!/usr/bin/env bash
# Runs Apache Beam's Go integration tests
# (github.com/apache/beam/sdks/v2/go/test/integration/{primitives,wordcount,
# synthetic}, Beam Go SDK v2.77.0, compiled into go/bin/*.test by
# scripts/setup_go.sh) against target/release/weir, as Beam runs them against
# a portable runner: `--runner=universal --endpoint=localhost:PORT
# --environment_type=LOOPBACK|PROCESS` (PROCESS: Beam's Go boot program
# go/bin/beam-go-boot as the environment's command, the test binary as the
# worker binary). Under `--runner=universal` Beam's integration.CheckFilters
# skips nothing. The script starts its own `weir serve` on a free port.
#
#   conformance/go.sh ledger          run the tests listed in conformance/go_ledger.txt
#                                     (one process per package and environment);
#                                     fail if any of them does not pass
#   conformance/go.sh all             run every test, each in its own process, under
#                                     LOOPBACK and PROCESS; never stops early; writes
#                                     the passing ones (ledger lines) to
#                                     conformance/go-last-run-passing.txt, results
#                                     with times to out/conformance-go/results.txt
#   conformance/go.sh test ENV PKG.TEST...
#                                     run the named tests, showing their output
#
# Ledger lines are `ENV PACKAGE.TEST [slow]`, e.g. `LOOPBACK primitives.TestFlatten`;
# `ledger` skips the ones marked slow unless WEIR_GO_SLOW=1.
# Environment: WEIR_BIN (default target/release/weir), WEIR_GO_TIMEOUT
# (seconds per test, default 150), WEIR_GO_ENVS (for `all`, default
# "LOOPBACK PROCESS"), WEIR_GO_FILTER (for `all`: a regex of test names),
# WEIR_GO_OUT (logs, default out/conformance-go), WEIR_GO_PASSING (for `all`).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../scripts/lib.sh
source "$HERE/../scripts/lib.sh"
GOBIN="$REPO/go/bin"
LEDGER="$HERE/go_ledger.txt"
PASSING="${WEIR_GO_PASSING:-$HERE/go-last-run-passing.txt}"
OUT="${WEIR_GO_OUT:-$REPO/out/conformance-go}"
TIMEOUT="${WEIR_GO_TIMEOUT:-150}"
PACKAGES=(primitives wordcount synthetic)

usage() { sed -n '2,29p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "[go-conformance] ERROR: $*" >&2; exit 1; }

mode="${1:-}"
[ $# -gt 0 ] && shift
case "$mode" in ledger|all|test) ;; *) usage ;; esac

# Tests never run here, and why.
declare -A NEVER=(
  # Allocates until its SDK harness runs out of memory, then looks for the
  # heap dump Beam's boot program uploads to --temp_location (Dataflow's
  # contract); not for a shared 2-core machine.
  [primitives.TestOomParDo]=1
)

# Extra flags some tests need.
extra_flags() {
  case "$1" in
    # Drained at once by Weir (its test-only experiment): the SDF's
    # TruncateRestriction ends it; Beam's test does not drain by itself.
    primitives.TestDrain) echo "--experiments=weir_test_drain_at_start" ;;
  esac
}

require_weir
for p in "${PACKAGES[@]}"; do
  [ -x "$GOBIN/$p.test" ] || die "missing $GOBIN/$p.test; run scripts/setup_go.sh"
done
[ -x "$GOBIN/beam-go-boot" ] || die "missing $GOBIN/beam-go-boot; run scripts/setup_go.sh"

mkdir -p "$OUT"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/weir-go-conformance.XXXXXX")"
PORT="$(free_port)"
WEIR_LOG="$OUT/weir.log"
# PROCESS runs Beam's Go boot program: allowed beyond Weir's own `weir boot`.
NO_COLOR=1 RUST_LOG="${RUST_LOG:-info}" "$WEIR" serve --job_port "$PORT" --bind 127.0.0.1 \
  --allow_process_command "$GOBIN/beam-go-boot" \
  >"$WEIR_LOG" 2>&1 </dev/null &
WEIR_PID=$!
cleanup() { stop_pid "$WEIR_PID"; rm -rf "$WORK"; }
trap cleanup EXIT
wait_for_port "$PORT" "$WEIR_PID" "$WEIR_LOG"

# env_flags ENV PACKAGE: the runner flags for one environment.
env_flags() {
  local env="$1" pkg="$2"
  printf '%s\n' --runner=universal "--endpoint=localhost:$PORT" "--environment_type=$env"
  if [ "$env" = PROCESS ]; then
    printf '%s\n' "--environment_config={\"command\": \"$GOBIN/beam-go-boot\"}" \
      "--worker_binary=$GOBIN/$pkg.test"
  fi
}

# run_tests ENV PACKAGE REGEX LOG [EXTRA_FLAG...]: runs the tests of PACKAGE
# matching REGEX in one process (from $WORK: some tests write files), output
# to LOG; returns the test binary's exit code.
run_tests() {
  local env="$1" pkg="$2" re="$3" log="$4" budget="$5"
  shift 5
  local flags rc=0 before
  mapfile -t flags < <(env_flags "$env" "$pkg")
  before="$(go_boot_copies)"
  (cd "$WORK" && timeout -k 10 "$budget" "$GOBIN/$pkg.test" -test.run "$re" -test.v \
    -test.timeout "${budget}s" "${flags[@]}" "$@") >"$log" 2>&1 || rc=$?
  # Beam's Go boot copies the worker binary to /tmp/bin*/worker for each
  # SDK harness and never removes it (in a container /tmp goes with it):
  # ~100 MB per PROCESS harness. Remove the copies of this run's binary.
  comm -13 <(printf '%s\n' "$before") <(go_boot_copies) | while read -r d; do
    if [ -n "$d" ] && [ "$(stat -c %s "$d/worker")" = "$(stat -c %s "$GOBIN/$pkg.test")" ]; then
      rm -rf "$d"
    fi
  done || true
  return "$rc"
}

# go_boot_copies: the /tmp/bin* folders holding a worker binary, sorted.
go_boot_copies() {
  find /tmp -maxdepth 2 -path '/tmp/bin*/worker' -type f 2>/dev/null | xargs -r -n1 dirname | sort
}

# passed LOG TEST: true when LOG reports TEST passed.
passed() { grep -q -- "^--- PASS: $2 " "$1"; }

# list PACKAGE: its top-level test names.
list() { (cd "$WORK" && "$GOBIN/$1.test" -test.list '.*' 2>/dev/null) | grep '^Test' || true; }

ledger_lines() { sed -e 's/#.*//' -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' "$LEDGER" | awk 'NF && !seen[$0]++'; }

case "$mode" in
  ledger)
    [ -f "$LEDGER" ] || die "missing ledger $LEDGER"
    mapfile -t lines < <(ledger_lines)
    [ "${#lines[@]}" -gt 0 ] || { echo "[go-conformance] the ledger lists no tests: OK"; exit 0; }
    declare -A groups=()
    declare -A known=()
    for p in "${PACKAGES[@]}"; do
      while read -r t; do known[$p.$t]=1; done < <(list "$p")
    done
    selected=0
    for l in "${lines[@]}"; do
      read -r env name tag <<<"$l"
      case "$env" in LOOPBACK|PROCESS) ;; *) die "ledger line without LOOPBACK/PROCESS: $l" ;; esac
      case "${tag:-}" in
        "") ;;
        slow) [ "${WEIR_GO_SLOW:-0}" = 1 ] || continue ;;
        *) die "ledger line with an unknown mark (only 'slow'): $l" ;;
      esac
      selected=$((selected + 1))
      [ -n "${known[$name]:-}" ] || die "ledger names an unknown test: $name"
      pkg="${name%%.*}"
      t="${name#*.}"
      if [ -n "$(extra_flags "$name")" ]; then
        groups["$env $pkg $t"]="$t"
      else
        groups["$env $pkg"]+="${groups["$env $pkg"]:+|}$t"
      fi
    done
    echo "[go-conformance] running $selected of the ledger's ${#lines[@]} test(s) against $WEIR (WEIR_GO_SLOW=1: the slow ones too)"
    failed=()
    start=$(date +%s)
    for g in $(printf '%s\n' "${!groups[@]}" | sort | tr ' ' '~'); do
      g="${g//\~/ }"
      read -r env pkg single <<<"$g"
      tests="${groups[$g]}"
      n=$(tr '|' '\n' <<<"$tests" | wc -l)
      log="$OUT/ledger-$env-$pkg${single:+-$single}.log"
      extra=()
      [ -n "$single" ] && read -r -a extra <<<"$(extra_flags "$pkg.$single")"
      t0=$(date +%s)
      rc=0
      run_tests "$env" "$pkg" "^($tests)\$" "$log" $(( n * TIMEOUT )) "${extra[@]}" || rc=$?
      for t in $(tr '|' ' ' <<<"$tests"); do
        passed "$log" "$t" || failed+=("$env $pkg.$t")
      done
      echo "[go-conformance] $env $pkg${single:+ $single}: $n test(s), exit $rc, $(( $(date +%s) - t0 )) s ($log)"
    done
    echo "[go-conformance] $(( $(date +%s) - start )) s; weir log $(wc -c <"$WEIR_LOG") bytes"
    if [ "${#failed[@]}" -gt 0 ]; then
      printf '[go-conformance] FAILED: %s\n' "${failed[@]}" >&2
      echo "$(( selected - ${#failed[@]} )) passed, ${#failed[@]} failed"
      exit 1
    fi
    echo "$selected passed, 0 failed"
    ;;

  all)
    : >"$OUT/results.txt"
    passing=()
    for env in ${WEIR_GO_ENVS:-LOOPBACK PROCESS}; do
      for p in "${PACKAGES[@]}"; do
        for t in $(list "$p"); do
          name="$p.$t"
          [[ "$t" =~ ${WEIR_GO_FILTER:-.} ]] || continue
          if [ -n "${NEVER[$name]:-}" ]; then
            echo "NOT-RUN $env $name" >>"$OUT/results.txt"
            continue
          fi
          log="$OUT/$env-$name.log"
          read -r -a extra <<<"$(extra_flags "$name")"
          t0=$(date +%s.%N)
          rc=0
          run_tests "$env" "$p" "^$t\$" "$log" "$TIMEOUT" "${extra[@]}" || rc=$?
          secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
          if grep -q -- "^--- SKIP: $t " "$log"; then r=SKIP
          elif passed "$log" "$t"; then r=PASS; passing+=("$env $name")
          elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then r=TIMEOUT
          else r=FAIL; fi
          echo "$r $env $name ${secs}s" | tee -a "$OUT/results.txt"
        done
      done
    done
    printf '%s\n' "${passing[@]}" | sort >"$PASSING"
    echo "[go-conformance] $(grep -c '^PASS' "$OUT/results.txt") passed, $(grep -c -E '^(FAIL|TIMEOUT)' "$OUT/results.txt") failed; passing: $PASSING"
    ;;

  test)
    [ $# -ge 2 ] || usage
    env="$1"
    shift
    rc=0
    for name in "$@"; do
      pkg="${name%%.*}"
      t="${name#*.}"
      read -r -a extra <<<"$(extra_flags "$name")"
      run_tests "$env" "$pkg" "^$t\$" "$OUT/test-$env-$name.log" "$TIMEOUT" "${extra[@]}" || rc=1
      cat "$OUT/test-$env-$name.log"
    done
    exit "$rc"
    ;;
esac
