#!/usr/bin/env bash
# Runs Apache Beam's portable-runner conformance tests
# (apache_beam/runners/portability/prism_runner_test.py::PrismRunnerTest, from
# the apache-beam wheel in .venv) against target/release/weir. Beam's harness
# starts `weir --job_port N` itself and submits each test's pipeline with the
# LOOPBACK environment.
#
#   conformance/run.sh ledger        run the tests listed in conformance/ledger.txt
#                                    in one pytest process; fail if any fails
#   conformance/run.sh all           run every test, each in its own pytest
#                                    process (a crash or hang can't spill over);
#                                    never stops early; writes the passing names
#                                    to conformance/last-run-passing.txt and
#                                    logs to out/conformance/
#   conformance/run.sh test NAME...  run the named tests in one pytest process,
#                                    showing their output
#
# Environment: WEIR_BIN (binary, default target/release/weir),
# WEIR_SHARED_DIR (folder holding conformance/beam_test_options.py, default
# ../shared beside the repo), WEIR_CONFORMANCE_TIMEOUT (seconds per test,
# default 120).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
PY="$REPO/.venv/bin/python"
WEIR="${WEIR_BIN:-$REPO/target/release/weir}"
LEDGER="$HERE/ledger.txt"
PASSING="$HERE/last-run-passing.txt"
TIMEOUT="${WEIR_CONFORMANCE_TIMEOUT:-120}"

usage() { sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "[conformance] ERROR: $*" >&2; exit 1; }

mode="${1:-}"
[ $# -gt 0 ] && shift
case "$mode" in ledger|all|test) ;; *) usage ;; esac

# --- where things are -----------------------------------------------------------
if [ -n "${WEIR_SHARED_DIR:-}" ]; then
  SHARED="$WEIR_SHARED_DIR"
else
  top="$(git -C "$REPO" rev-parse --show-toplevel 2>/dev/null || echo "$REPO")"
  SHARED="$top/../shared"
fi
PLUGIN_DIR="$(cd "$SHARED/conformance" 2>/dev/null && pwd)" ||
  die "no $SHARED/conformance (beam_test_options.py); set WEIR_SHARED_DIR"
[ -f "$PLUGIN_DIR/beam_test_options.py" ] || die "missing $PLUGIN_DIR/beam_test_options.py"
[ -x "$PY" ] || die "missing $PY; run scripts/setup.sh"
# (A command substitution, not `sed | grep -q`: under pipefail grep's early
# exit can kill sed with SIGPIPE and fail the pipeline, which read as "no tests"
# and skipped the whole ledger.)
if [ "$mode" = ledger ] && [ -z "$(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$LEDGER")" ]; then
  echo "[conformance] the ledger ($LEDGER) lists no tests yet: nothing to run, OK"
  exit 0
fi
[ -x "$WEIR" ] || die "missing $WEIR; run scripts/setup.sh"
WEIR="$(cd "$(dirname "$WEIR")" && pwd)/$(basename "$WEIR")"  # the harness needs it absolute

SP="$("$PY" -c 'import apache_beam, os; print(os.path.dirname(apache_beam.__file__))' 2>/dev/null)"
CLASS="$SP/runners/portability/prism_runner_test.py::PrismRunnerTest"
[ -f "${CLASS%%::*}" ] || die "missing ${CLASS%%::*}"

export PYTHONPATH="$PLUGIN_DIR${PYTHONPATH:+:$PYTHONPATH}"
export NO_COLOR="${NO_COLOR:-1}"  # plain weir logs
PYTEST=("$PY" -m pytest -p beam_test_options -p no:cacheprovider
  "--timeout=$TIMEOUT"
  "--test-pipeline-options=--prism_bin=$WEIR --environment_type=LOOPBACK")

# Run pytest from a scratch folder: some Beam tests write files into the cwd.
WORK="$(mktemp -d "${TMPDIR:-/tmp}/weir-conformance.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"

# all_tests: prints the names of all tests in the class, one a line.
all_tests() {
  "${PYTEST[@]}" --collect-only -q "$CLASS" 2>/dev/null |
    sed -n 's/.*::PrismRunnerTest::\(test_[A-Za-z0-9_]*\).*/\1/p'
}

# ledger_tests: prints the ledger's names (no comments, no blanks), deduplicated.
ledger_tests() {
  sed -e 's/#.*//' -e 's/[[:space:]]//g' "$LEDGER" | awk 'NF && !seen[$0]++'
}

case "$mode" in
  ledger)
    mapfile -t names < <(ledger_tests)
    if [ "${#names[@]}" -eq 0 ]; then
      echo "[conformance] the ledger ($LEDGER) lists no tests yet: nothing to run, OK"
      exit 0
    fi
    mapfile -t known < <(all_tests)
    [ "${#known[@]}" -gt 0 ] || die "could not list the tests of $CLASS"
    # (A lookup table, not `printf | grep -q`: under pipefail grep's early
    # exit can kill printf with SIGPIPE and fail a name that is there.)
    declare -A is_known=()
    for k in "${known[@]}"; do is_known[$k]=1; done
    for n in "${names[@]}"; do
      case "$n" in WeirRunnerTest::*|WeirClusterRunnerTest::*) continue ;; esac
      [ -n "${is_known[$n]:-}" ] || die "ledger names an unknown test: $n"
    done
    # `WeirRunnerTest::NAME` lines are tests Beam's suite skips only because
    # Prism lacks the feature, re-enabled in conformance/weir_runner_test.py;
    # `WeirClusterRunnerTest::NAME` ones run on three worker processes
    # (conformance/weir_cluster_test.py).
    ids=()
    for n in "${names[@]}"; do
      case "$n" in
        WeirRunnerTest::*) ids+=("$HERE/weir_runner_test.py::$n") ;;
        WeirClusterRunnerTest::*) ids+=("$HERE/weir_cluster_test.py::$n") ;;
        *) ids+=("$CLASS::$n") ;;
      esac
    done
    echo "[conformance] running the ledger's ${#names[@]} test(s) against $WEIR"
    budget=$(( ${#names[@]} * (TIMEOUT + 15) + 300 ))
    rc=0
    timeout -k 30 "$budget" "${PYTEST[@]}" -rfEs "${ids[@]}" || rc=$?
    if [ "$rc" -ne 0 ]; then
      echo "[conformance] FAILED: a ledger test did not pass (pytest exit $rc)" >&2
      exit 1
    fi
    echo "[conformance] all ${#names[@]} ledger test(s) passed"
    ;;

  test)
    [ $# -gt 0 ] || usage
    ids=()
    for n in "$@"; do
      case "$n" in
        WeirRunnerTest::*) ids+=("$HERE/weir_runner_test.py::$n") ;;
        WeirClusterRunnerTest::*) ids+=("$HERE/weir_cluster_test.py::$n") ;;
        *) ids+=("$CLASS::${n##*::}") ;;
      esac
    done
    exec "${PYTEST[@]}" -rfEs "${ids[@]}"
    ;;

  all)
    mapfile -t names < <(all_tests)
    [ "${#names[@]}" -gt 0 ] || die "could not list the tests of $CLASS"
    LOGS="$REPO/out/conformance"
    rm -rf "$LOGS"
    mkdir -p "$LOGS/junit"
    echo "[conformance] running ${#names[@]} tests against $WEIR, one pytest process each"
    echo "[conformance] logs: $LOGS/<test>.log"
    i=0
    for n in "${names[@]}"; do
      i=$((i + 1))
      start=$SECONDS
      rc=0
      timeout -k 15 $((TIMEOUT + 60)) "${PYTEST[@]}" -rA \
        "--junitxml=$LOGS/junit/$n.xml" "$CLASS::$n" >"$LOGS/$n.log" 2>&1 || rc=$?
      printf '[%2d/%d] %-60s exit %-3s %4ss\n' "$i" "${#names[@]}" "$n" "$rc" $((SECONDS - start))
    done
    "$PY" - "$LOGS/junit" "$PASSING" "$LEDGER" "${names[@]}" <<'EOF'
import os, re, sys
import xml.etree.ElementTree as ET

junit_dir, passing_path, ledger_path, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
outcome = {}
for n in names:
  path = os.path.join(junit_dir, n + '.xml')
  if not os.path.exists(path):
    outcome[n] = 'no result (killed or crashed)'
    continue
  cases = [c for c in ET.parse(path).getroot().iter('testcase') if c.get('name') == n]
  if not cases:
    outcome[n] = 'no result'
    continue
  kinds = {child.tag for c in cases for child in c}
  if 'error' in kinds:
    outcome[n] = 'error'
  elif 'failure' in kinds:
    outcome[n] = 'failed'
  elif 'skipped' in kinds:
    outcome[n] = 'skipped'
  else:
    outcome[n] = 'passed'

passing = sorted(n for n, o in outcome.items() if o == 'passed')
with open(passing_path, 'w') as f:
  f.write(''.join(n + '\n' for n in passing))

ledger = set()
with open(ledger_path) as f:
  for line in f:
    line = re.sub(r'#.*', '', line).strip()
    if line:
      ledger.add(line)

counts = {}
for o in outcome.values():
  counts[o] = counts.get(o, 0) + 1
print()
print('[conformance] %d/%d passed (%s)' % (
    len(passing), len(names),
    ', '.join('%d %s' % (v, k) for k, v in sorted(counts.items()))))
print('[conformance] passing names written to %s' % passing_path)
lost = sorted(ledger - set(passing))
new = sorted(set(passing) - ledger)
if lost:
  print('[conformance] in the ledger but NOT passing now: %s' % ' '.join(lost))
if new:
  print('[conformance] passing but not in the ledger yet: %s' % ' '.join(new))
EOF
    ;;
esac
