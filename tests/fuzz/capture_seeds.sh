#!/usr/bin/env bash
# Captures the fuzzer's seeds: the PrepareJobRequest that Beam's Python,
# Java and Go SDKs send for a small word count, as `weir serve
# --capture_prepare_dir` records it, into tests/fuzz/seeds/<sdk>_wordcount.pb.
# Run once from the repository root after scripts/setup.sh, setup_java.sh and
# setup_go.sh; the .pb files are committed and the fuzzer only reads them.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
WEIR=$REPO/target/release/weir
PY=$REPO/.venv/bin/python
SEEDS=$REPO/tests/fuzz/seeds
work=$(mktemp -d)
trap 'kill $server 2>/dev/null || true; rm -rf "$work"' EXIT
printf 'the cat sat\non the mat\n' > "$work/in.txt"
port=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

capture() { # name, command...
  local name=$1; shift
  rm -rf "$work/cap"; mkdir -p "$work/cap"
  "$WEIR" serve --job_port "$port" --staging_dir "$work/staging" --capture_prepare_dir "$work/cap" \
    >"$work/weir-$name.log" 2>&1 &
  server=$!
  sleep 2
  "$@" >"$work/$name.out" 2>&1 || echo "($name: the pipeline itself failed; its Prepare is still captured)"
  kill $server; wait $server 2>/dev/null || true
  local got
  got=$(ls "$work"/cap/*.pb | head -1)
  cp "$got" "$SEEDS/${name}_wordcount.pb"
  echo "captured $SEEDS/${name}_wordcount.pb ($(stat -c %s "$got") bytes)"
}

capture python "$PY" -m apache_beam.examples.wordcount --input "$work/in.txt" --output "$work/py-out" \
  --runner=PortableRunner --job_endpoint=localhost:$port --environment_type=LOOPBACK
CP="$REPO/java/target/weir-runner-java-0.1.0-SNAPSHOT.jar:$(cat "$REPO/java/target/classpath.txt")"
capture java java -cp "$CP" dev.weir.examples.WordCount --inputFile="$work/in.txt" --output="$work/java-out" \
  --runner=WeirRunner --jobEndpoint=localhost:$port --weirBinary="$WEIR" --defaultEnvironmentType=PROCESS
capture go "$REPO/go/bin/wordcount" --input="$work/in.txt" --output="$work/go-out" \
  --runner=universal --endpoint=localhost:$port --environment_type=LOOPBACK
