#!/usr/bin/env bash
# Builds Weir's Java side with Maven (called by scripts/setup.sh):
#   java/          WeirRunner / TestWeirRunner (java/target/*.jar, and
#                  java/target/classpath.txt: its runtime classpath)
#   java/harness/  the Java SDK harness jars that `weir boot --java` puts on a
#                  PROCESS worker's classpath (java/harness/target/jars)
#   java/expansion/ the classpath of Beam's Java expansion service that
#                  `weir expansion-service` starts (java/expansion/target/jars:
#                  Beam Java 2.71.0 with KafkaIO and Beam SQL, see its pom.xml)
#   java/multilang/ a Java pipeline with a Python step (tests/e2e/test_multilang.py)
# Beam Java 2.73.0 (the expansion service 2.71.0), Java 17; dependencies are cached in ~/.m2. Idempotent: skips
# Maven while the poms and java/src are unchanged and the outputs exist.
#
# Environment:
#   WEIR_SKIP_JAVA=1     don't build the Java side
#   WEIR_MAVEN_ARGS=...  extra Maven arguments (e.g. -Dmaven.repo.local=DIR)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO/java"

say() { printf '[setup-java] %s\n' "$*" >&2; }
die() { printf '[setup-java] ERROR: %s\n' "$*" >&2; exit 1; }

if [ "${WEIR_SKIP_JAVA:-0}" = "1" ]; then
  say "WEIR_SKIP_JAVA=1: skipping the Java build"
  exit 0
fi

command -v java >/dev/null 2>&1 || die "java not found; install a JDK 17 (apt-get install openjdk-17-jdk-headless)"
if ! command -v mvn >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    say "mvn not found; installing Debian's maven"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven >/dev/null
  fi
  command -v mvn >/dev/null 2>&1 || die "mvn not found; install Maven 3 and re-run"
fi

STAMP="target/.weir-build.sha256"
RUNNER_JAR="target/weir-runner-java-0.1.0-SNAPSHOT.jar"
want="$( (sha256sum pom.xml harness/pom.xml expansion/pom.xml multilang/pom.xml; find src expansion/src multilang/src -type f -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -d' ' -f1)"
have="$(cat "$STAMP" 2>/dev/null || true)"
if [ "$want" = "$have" ] && [ -f "$RUNNER_JAR" ] && [ -f target/classpath.txt ] \
    && [ -d harness/target/jars ] && [ -d expansion/target/jars ] \
    && [ -f multilang/target/classpath.txt ]; then
  say "Java runner up to date ($STAMP)"
  exit 0
fi

# shellcheck disable=SC2086
mvn_() { mvn -B -q -Dstyle.color=never ${WEIR_MAVEN_ARGS:-} "$@"; }
start=$SECONDS
say "mvn package in java/harness (Java SDK harness jars for weir boot --java)"
rm -rf harness/target/jars
(cd harness && mvn_ package)
say "mvn package in java/expansion (Java expansion service jars for weir expansion-service)"
rm -rf expansion/target/jars
(cd expansion && mvn_ package)
say "mvn package in java/multilang (multi-language example pipelines)"
(cd multilang && mvn_ package)
say "mvn package in java/ (WeirRunner)"
mvn_ package -DskipTests
mkdir -p target
printf '%s\n' "$want" > "$STAMP"
say "ready in $((SECONDS - start)) s: java/$RUNNER_JAR, java/harness/target/jars ($(ls harness/target/jars | wc -l) jars), java/expansion/target/jars ($(ls expansion/target/jars | wc -l) jars)"
