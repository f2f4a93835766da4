#!/usr/bin/env bash
# Runs Apache Beam's Java ValidatesRunner tests (the tests jar of
# beam-sdks-java-core 2.73.0, category ValidatesRunner, minus the categories
# Beam's portable runners exclude; see conformance/java/pom.xml) through
# Weir's TestWeirRunner (java/) against a `weir serve` this script starts,
# with SDK harnesses in the test JVM (LOOPBACK).
#
#   conformance/java.sh ledger       run the tests listed in conformance/java_ledger.txt;
#                                    fail if any of them does not pass
#   conformance/java.sh all          run every ValidatesRunner test; never stops early;
#                                    writes the passing names to
#                                    conformance/java-last-run-passing.txt and the
#                                    failing ones (with their first message line) to
#                                    conformance/java-last-run-failing.txt
#   conformance/java.sh test PATTERN...
#                                    run the tests surefire's -Dtest patterns name
#                                    (e.g. 'ParDoTest$StateTests#testSetState*')
#
# Test names are CLASS#METHOD, e.g. org.apache.beam.sdk.transforms.ParDoTest$StateTests#testValueStateSimple.
# Logs: out/conformance-java/ (weir.log, maven.log, surefire-reports/).
# Environment: WEIR_BIN (binary, default target/release/weir),
# WEIR_JAVA_TEST_TIMEOUT (seconds per pipeline, default 180),
# WEIR_JAVA_ENV (defaultEnvironmentType, default LOOPBACK), WEIR_JAVA_RERUN_MAX (ledger
# failures run once more, alone, when at most this many; default 5, 0 = never).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
WEIR="${WEIR_BIN:-$REPO/target/release/weir}"
# WeirRunner builds the PROCESS boot command from it (WEIR_JAVA_ENV=PROCESS).
export WEIR_BIN="$WEIR"
LEDGER="${WEIR_JAVA_LEDGER:-$HERE/java_ledger.txt}"
PASSING="$HERE/java-last-run-passing.txt"
FAILING="$HERE/java-last-run-failing.txt"
OUT="$REPO/out/conformance-java"
PROJECT="$HERE/java"
TIMEOUT="${WEIR_JAVA_TEST_TIMEOUT:-180}"
ENV_TYPE="${WEIR_JAVA_ENV:-LOOPBACK}"
# Ledger failures run once more when there are at most this many.
RERUN_MAX="${WEIR_JAVA_RERUN_MAX:-5}"

usage() { sed -n '2,26p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "[conformance-java] ERROR: $*" >&2; exit 1; }
say() { echo "[conformance-java] $*" >&2; }

mode="${1:-}"
[ $# -gt 0 ] && shift
case "$mode" in ledger|all|test) ;; *) usage ;; esac
[ "$mode" != test ] || [ $# -gt 0 ] || usage

# ledger_tests: the ledger's names (no comments, no blanks), deduplicated.
ledger_tests() {
  sed -e 's/#[[:space:]].*//' -e 's/^#.*//' -e 's/[[:space:]]//g' "$LEDGER" | awk 'NF && !seen[$0]++'
}
[ "$mode" != ledger ] || [ -f "$LEDGER" ] || die "missing ledger $LEDGER"
if [ "$mode" = ledger ] && [ -z "$(ledger_tests)" ]; then
  say "the ledger ($LEDGER) lists no tests yet: nothing to run, OK"
  exit 0
fi

command -v mvn >/dev/null || die "no mvn on the PATH (scripts/setup.sh installs Maven)"
command -v java >/dev/null || die "no java on the PATH (Java 17 is needed)"
command -v python3 >/dev/null || die "no python3 on the PATH"
[ -x "$WEIR" ] || die "missing $WEIR; run scripts/setup.sh"
WEIR="$(cd "$(dirname "$WEIR")" && pwd)/$(basename "$WEIR")"

rm -rf "$OUT"
mkdir -p "$OUT"
MVN=(mvn -B -q)

# The runner module, installed into the local Maven repository, where the
# test project finds it.
say "installing Weir's Java runner (java/)"
"${MVN[@]}" -f "$REPO/java/pom.xml" install -DskipTests >"$OUT/install.log" 2>&1 ||
  { tail -40 "$OUT/install.log" >&2; die "mvn install of java/ failed (log: $OUT/install.log)"; }

PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
NO_COLOR=1 "$WEIR" serve --job_port "$PORT" >"$OUT/weir.log" 2>&1 &
WEIR_PID=$!
trap 'kill "$WEIR_PID" 2>/dev/null || true; wait "$WEIR_PID" 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  if python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $PORT), 0.2)" 2>/dev/null; then
    break
  fi
  kill -0 "$WEIR_PID" 2>/dev/null || { tail -20 "$OUT/weir.log" >&2; die "weir serve exited"; }
  sleep 0.1
done
say "weir serve on 127.0.0.1:$PORT (log: $OUT/weir.log)"

OPTIONS="[\"--runner=TestWeirRunner\",\"--jobEndpoint=localhost:$PORT\",\"--defaultEnvironmentType=$ENV_TYPE\",\"--testTimeoutSeconds=$TIMEOUT\"]"

# tests_arg NAME...: surefire's -Dtest value for CLASS#METHOD names, one
# pattern per class (CLASS#m1+m2).
tests_arg() {
  printf '%s\n' "$@" | awk -F'#' '
    { if (!($1 in ms)) order[n++] = $1; ms[$1] = ($1 in ms) ? ms[$1] "+" $2 : $2 }
    END { for (i = 0; i < n; i++) printf "%s%s#%s", (i ? "," : ""), order[i], ms[order[i]] }'
}

# run_surefire [-Dtest=...]: runs the test project; its exit code is ignored
# (the reports say what passed).
run_surefire() {
  local start=$SECONDS
  (cd "$PROJECT" && "${MVN[@]}" test "-DbeamTestPipelineOptions=$OPTIONS" "$@") >"$OUT/maven.log" 2>&1 || true
  say "maven ran for $((SECONDS - start)) s (log: $OUT/maven.log)"
  rm -rf "$OUT/surefire-reports"
  [ -d "$PROJECT/target/surefire-reports" ] && cp -r "$PROJECT/target/surefire-reports" "$OUT/"
  return 0
}

# results: prints "STATUS CLASS#METHOD first line of message" for every test
# case of the surefire reports; STATUS is PASS, FAIL, ERROR or SKIP.
results() {
  python3 - "$OUT/surefire-reports" <<'EOF'
import glob, os, sys
import xml.etree.ElementTree as ET
for f in sorted(glob.glob(os.path.join(sys.argv[1], 'TEST-*.xml'))):
  for tc in ET.parse(f).getroot().iter('testcase'):
    status, message = 'PASS', ''
    for tag, name in (('failure', 'FAIL'), ('error', 'ERROR'), ('skipped', 'SKIP')):
      e = tc.find(tag)
      if e is not None:
        status = name
        text = (e.get('message') or e.text or '').strip().splitlines()
        message = ' '.join(text[:3])[:300] if text else ''
        break
    print(status, '%s#%s' % (tc.get('classname'), tc.get('name')), message)
EOF
}

case "$mode" in
  all)
    say "running every ValidatesRunner test"
    rm -rf "$PROJECT/target/surefire-reports"
    run_surefire
    results >"$OUT/results.txt"
    awk '$1 == "PASS" { print $2 }' "$OUT/results.txt" | sort -u >"$PASSING"
    awk '$1 == "FAIL" || $1 == "ERROR"' "$OUT/results.txt" | sort -k2 >"$FAILING"
    say "$(wc -l <"$PASSING") passed, $(wc -l <"$FAILING") failed, $(awk '$1 == "SKIP"' "$OUT/results.txt" | wc -l) skipped"
    say "passing: $PASSING; failing: $FAILING"
    ;;
  ledger)
    mapfile -t want < <(ledger_tests)
    say "running the ${#want[@]} tests of $LEDGER"
    rm -rf "$PROJECT/target/surefire-reports"
    run_surefire "-Dtest=$(tests_arg "${want[@]}")"
    results >"$OUT/results.txt"
    passed="$(awk '$1 == "PASS" { print $2 }' "$OUT/results.txt" | sort -u)"
    missing="$(printf '%s\n' "${want[@]}" | sort -u | comm -23 - <(printf '%s\n' "$passed"))"
    # A few failures are run once more, alone: one that passes then is
    # reported as flaky (out/conformance-java/flaky.txt), not as a failure.
    n_missing=$(printf '%s' "$missing" | grep -c . || true)
    if [ "$n_missing" -gt 0 ] && [ "$n_missing" -le "$RERUN_MAX" ]; then
      mapfile -t again <<<"$missing"
      cp "$OUT/results.txt" "$OUT/results-first.txt"
      cp "$OUT/maven.log" "$OUT/maven-first.log"
      say "running the $n_missing failed ledger test(s) once more: ${again[*]}"
      rm -rf "$PROJECT/target/surefire-reports"
      run_surefire "-Dtest=$(tests_arg "${again[@]}")"
      results >"$OUT/results-rerun.txt"
      flaky="$(awk '$1 == "PASS" { print $2 }' "$OUT/results-rerun.txt" | sort -u)"
      if [ -n "$flaky" ]; then
        printf '%s\n' "$flaky" >"$OUT/flaky.txt"
        say "FLAKY: failed, then passed when run again (first run: $OUT/results-first.txt):"
        while read -r t; do
          line="$(awk -v t="$t" '$2 == t' "$OUT/results-first.txt" | head -1)"
          echo "  $t: first run: ${line:-did not run}" >&2
        done <<<"$flaky"
      fi
      missing="$(printf '%s\n' "$missing" | comm -23 - <(printf '%s\n' "$flaky"))"
      cat "$OUT/results-first.txt" "$OUT/results-rerun.txt" >"$OUT/results.txt"
    fi
    n_pass=$(( ${#want[@]} - $(printf '%s' "$missing" | grep -c . || true) ))
    if [ -n "$missing" ]; then
      say "these ledger tests did not pass:"
      while read -r t; do
        line="$(awk -v t="$t" '$2 == t' "$OUT/results.txt" | head -1)"
        echo "  $t: ${line:-did not run}" >&2
      done <<<"$missing"
      echo "java-ledger: $n_pass passed, $(printf '%s\n' "$missing" | grep -c .) failed"
      exit 1
    fi
    echo "java-ledger: $n_pass passed, 0 failed"
    ;;
  test)
    rm -rf "$PROJECT/target/surefire-reports"
    run_surefire "-Dtest=$(IFS=,; echo "$*")"
    results | tee "$OUT/results.txt"
    ;;
esac
