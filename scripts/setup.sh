#!/usr/bin/env bash
# Prepares a checkout of Weir: the web UI's npm packages (ui/), builds the
# release binary, the Python venv,
# the Java runner (scripts/setup_java.sh) and the Go test drivers
# (scripts/setup_go.sh; needs Go 1.26+). Idempotent: a second run only
# re-runs `cargo build` (a no-op when nothing changed), skips pip while
# python/requirements.txt is unchanged, Maven while java/ is unchanged and
# Go while go/ is unchanged.
#
# Environment:
#   WEIR_SKIP_BUILD=1   don't run cargo build (use the binary that is there)
#   WEIR_SKIP_JAVA=1    don't build the Java runner
#   WEIR_SKIP_GO=1      don't build the Go test drivers
#   WEIR_SKIP_BROWSER=1 don't install Debian's chromium (the web UI's browser test)
#   PYTHON=python3.x    interpreter used to create .venv (default: python3)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

say() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# --- Rust toolchain -------------------------------------------------------
if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
  if command -v rustup >/dev/null 2>&1; then
    say "cargo not found; installing the stable toolchain with rustup"
    rustup toolchain install stable --profile minimal
    rustup default stable
  else
    die "cargo not found and rustup is not installed; install Rust (https://rustup.rs) and re-run"
  fi
fi
command -v cargo >/dev/null 2>&1 || die "cargo still not found after rustup"

# --- Web UI: front-end libraries (embedded by crates/web) and the browser ----
# test's driver, from ui/package-lock.json; Debian's chromium for that test.
UI_STAMP="$REPO/ui/node_modules/.weir-lock.sha256"
ui_want="$(sha256sum "$REPO/ui/package-lock.json" | cut -d' ' -f1)"
if [ "$(cat "$UI_STAMP" 2>/dev/null || true)" = "$ui_want" ]; then
  say "ui/node_modules up to date"
else
  command -v npm >/dev/null 2>&1 || die "npm not found; install Node.js 20+ (the web UI embeds ui/node_modules)"
  say "npm ci --prefix ui"
  npm ci --prefix "$REPO/ui" --no-audit --no-fund --loglevel=error
  printf '%s\n' "$ui_want" > "$UI_STAMP"
fi
if [ ! -x "${WEIR_CHROMIUM:-/usr/bin/chromium}" ] && [ "${WEIR_SKIP_BROWSER:-0}" != "1" ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    say "apt-get install chromium (the web UI's browser test)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; } \
      || say "WARNING: could not install chromium; tests/e2e/test_ui.py's browser test will fail"
  else
    say "WARNING: no chromium at /usr/bin/chromium (Debian: apt-get install chromium); the browser test will fail"
  fi
fi

if [ "${WEIR_SKIP_BUILD:-0}" = "1" ]; then
  say "WEIR_SKIP_BUILD=1: skipping cargo build"
else
  locked=()
  if [ -f Cargo.lock ]; then
    locked=(--locked)
  fi
  say "cargo build --release ${locked[*]:-}"
  cargo build --release "${locked[@]}"
fi

# --- Python venv ------------------------------------------------------------
PY="${PYTHON:-python3}"
VENV="$REPO/.venv"
REQ="$REPO/python/requirements.txt"
STAMP="$VENV/.weir-requirements.sha256"

if [ ! -x "$VENV/bin/python" ]; then
  command -v "$PY" >/dev/null 2>&1 || die "$PY not found; install Python 3 (3.9-3.13) and re-run"
  say "creating $VENV with $PY"
  "$PY" -m venv "$VENV"
fi

want="$(sha256sum "$REQ" | cut -d' ' -f1)"
have="$(cat "$STAMP" 2>/dev/null || true)"
if [ "$want" = "$have" ]; then
  say "python requirements up to date ($STAMP)"
else
  say "pip install -r python/requirements.txt into $VENV"
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q -r "$REQ"
  printf '%s\n' "$want" > "$STAMP"
fi

# --- Java runner and harness jars -------------------------------------------
bash "$REPO/scripts/setup_java.sh"

# --- Go test drivers, Beam's Go boot program and integration tests ----------
if [ "${WEIR_SKIP_GO:-0}" = "1" ]; then
  say "WEIR_SKIP_GO=1: skipping the Go test drivers"
else
  bash "$REPO/scripts/setup_go.sh"
fi

say "ready: $REPO/target/release/weir, $VENV/bin/python, $REPO/java/target, $REPO/go/bin"
