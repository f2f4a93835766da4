"""Java WordCount (dev.weir.examples.WordCount in java/) on King Lear through
WeirRunner must give Java DirectRunner's exact lines and user metrics, with
SDK harnesses in the submitting JVM (LOOPBACK), in a worker pool (EXTERNAL)
and started by Weir through `weir boot --java` (PROCESS).

Needs the Maven module built by scripts/setup_java.sh (java/target/ and the
harness jars in java/harness/target/jars).
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time

import pytest

from conftest import PIPELINE_TIMEOUT
from conftest import REPO
from conftest import WEIR_BIN
from conftest import free_port
from conftest import king_lear_path
from conftest import read_output

JAVA_TARGET = REPO / 'java' / 'target'
RUNNER_JAR = JAVA_TARGET / 'weir-runner-java-0.1.0-SNAPSHOT.jar'
CLASSPATH_FILE = JAVA_TARGET / 'classpath.txt'
HARNESS_JARS = REPO / 'java' / 'harness' / 'target' / 'jars'
WORDCOUNT = 'dev.weir.examples.WordCount'


@pytest.fixture(scope='module')
def classpath():
  for path in (RUNNER_JAR, CLASSPATH_FILE, HARNESS_JARS):
    if not path.exists():
      pytest.fail('%s is missing; run scripts/setup_java.sh first' % path)
  if shutil.which('java') is None:
    pytest.fail('no java on the PATH (Java 17 is needed)')
  return '%s:%s' % (RUNNER_JAR, CLASSPATH_FILE.read_text().strip())


def run_java(classpath, args, cwd, env=None):
  cmd = ['java', '-cp', classpath, WORDCOUNT] + [str(a) for a in args]
  try:
    done = subprocess.run(
        cmd, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=PIPELINE_TIMEOUT, env=env)
  except subprocess.TimeoutExpired as e:
    pytest.fail('%s did not finish within %.0fs\n%s' % (
        ' '.join(cmd[3:]), PIPELINE_TIMEOUT, (e.stderr or b'')[-6000:]))
  return cmd, done


def metrics(stdout):
  """The `metric NAME VALUE` lines WordCount prints, as a dict."""
  return dict(
      line.split(' ', 2)[1:] for line in stdout.splitlines()
      if line.startswith('metric '))


def wordcount(classpath, tmp, label, runner_args):
  prefix = tmp / label / 'counts'
  prefix.parent.mkdir(parents=True)
  cmd, done = run_java(
      classpath,
      ['--inputFile=%s' % king_lear_path(), '--output=%s' % prefix] + runner_args,
      prefix.parent)
  describe = 'command: %s\nexit %s\n--- stdout\n%s\n--- stderr (tail)\n%s' % (
      ' '.join(cmd[3:]), done.returncode, done.stdout[-3000:], done.stderr[-6000:])
  assert done.returncode == 0, describe
  files, lines = read_output(prefix)
  assert files, 'no output at %s-*\n%s' % (prefix, describe)
  return lines, metrics(done.stdout), describe


@pytest.fixture(scope='module')
def direct(classpath, tmp_path_factory):
  lines, counters, describe = wordcount(
      classpath, tmp_path_factory.mktemp('java-direct'), 'direct',
      ['--runner=DirectRunner', '--targetParallelism=2'])
  assert sum(lines.values()) > 4000, describe
  assert set(counters) == {'emptyLines', 'lineLength'}, describe
  return lines, counters


@pytest.fixture
def worker_pool(classpath, tmp_path):
  """A Java worker pool (Beam's ExternalWorkerService) for EXTERNAL."""
  port = free_port()
  env = dict(os.environ)
  env['PIPELINE_OPTIONS'] = json.dumps({'options': {
      'defaultEnvironmentType': 'EXTERNAL',
      'defaultEnvironmentConfig': 'localhost:%d' % port}})
  log = open(tmp_path / 'worker-pool.log', 'wb')
  proc = subprocess.Popen(
      ['java', '-cp', classpath, 'org.apache.beam.fn.harness.ExternalWorkerService'],
      stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
  # The JVM is stopped however the fixture ends, a start-up that timed out too.
  try:
    deadline = time.time() + 60
    while True:
      assert proc.poll() is None, 'worker pool exited: %s' % (
          (tmp_path / 'worker-pool.log').read_text()[-3000:])
      try:
        socket.create_connection(('127.0.0.1', port), timeout=1).close()
        break
      except OSError:
        assert time.time() < deadline, 'worker pool did not listen on %d' % port
        time.sleep(0.2)
    yield 'localhost:%d' % port
  finally:
    proc.send_signal(signal.SIGTERM)
    try:
      proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
    log.close()


def environment_args(env, request):
  if env == 'EXTERNAL':
    return ['--defaultEnvironmentType=EXTERNAL',
            '--defaultEnvironmentConfig=%s' % request.getfixturevalue('worker_pool')]
  # PROCESS: WeirRunner fills in `<weir> boot --java`, which finds the harness
  # jars in java/harness/target/jars next to the checkout of the binary.
  return ['--defaultEnvironmentType=%s' % env]


@pytest.mark.parametrize('env', ['LOOPBACK', 'PROCESS', 'EXTERNAL'])
def test_java_wordcount_matches_direct_runner(
    classpath, direct, weir_server, tmp_path, request, env):
  want_lines, want_metrics = direct
  lines, got_metrics, describe = wordcount(
      classpath, tmp_path, env.lower(),
      ['--runner=WeirRunner', '--jobEndpoint=%s' % weir_server.endpoint,
       '--weirBinary=%s' % WEIR_BIN] + environment_args(env, request))
  missing = want_lines - lines
  extra = lines - want_lines
  assert lines == want_lines, (
      '%d lines differ from DirectRunner; missing (first 10): %s; unexpected '
      '(first 10): %s\n%s\n--- weir log\n%s' % (
          sum((missing + extra).values()), list(missing.items())[:10],
          list(extra.items())[:10], describe, weir_server.log_tail()))
  assert got_metrics == want_metrics, describe


def test_weir_runner_starts_its_own_server(classpath, direct, tmp_path):
  """No --jobEndpoint: WeirRunner starts `weir serve` itself and stops it."""
  want_lines, _ = direct
  env = dict(os.environ, WEIR_BIN=str(WEIR_BIN))
  prefix = tmp_path / 'own' / 'counts'
  prefix.parent.mkdir()
  cmd, done = run_java(
      classpath,
      ['--inputFile=%s' % king_lear_path(), '--output=%s' % prefix,
       '--runner=WeirRunner'], prefix.parent, env=env)
  assert done.returncode == 0, done.stderr[-6000:]
  started = re.search(r'Started \S+ serve at 127\.0\.0\.1:(\d+)', done.stderr)
  assert started, done.stderr[-3000:]
  _, lines = read_output(prefix)
  assert lines == want_lines
  # The server went away with the job.
  with pytest.raises(ConnectionRefusedError):
    socket.create_connection(('127.0.0.1', int(started.group(1))), timeout=5).close()


def test_failed_java_job_reports_the_users_error(classpath, weir_server, tmp_path):
  """A job that fails in user code ends FAILED, and the client shows why."""
  missing = tmp_path / 'no-such-input.txt'
  cmd, done = run_java(
      classpath,
      ['--inputFile=%s' % missing, '--output=%s' % (tmp_path / 'counts'),
       '--runner=WeirRunner', '--jobEndpoint=%s' % weir_server.endpoint],
      tmp_path)
  assert done.returncode == 1, done.stderr[-6000:]
  assert 'state FAILED' in done.stdout.splitlines(), done.stdout
  assert 'No files matched spec: %s' % missing in done.stderr, done.stderr[-6000:]
  # Java's error names no transform: Weir's names the failed stage's.
  assert re.search(r"stage stage-\d+ \([^)]*ReadLines", done.stderr), done.stderr[-6000:]


def timer_order(classpath, tmp, label, runner_args):
  """dev.weir.examples.TimerOrder's lines (a Counter) on one runner."""
  prefix = tmp / label / 'out'
  prefix.parent.mkdir(parents=True)
  cmd = ['java', '-cp', classpath, 'dev.weir.examples.TimerOrder',
         '--output=%s' % prefix] + runner_args
  done = subprocess.run(
      cmd, cwd=prefix.parent, stdin=subprocess.DEVNULL, capture_output=True,
      text=True, timeout=PIPELINE_TIMEOUT)
  assert done.returncode == 0, 'exit %s\n%s\n%s' % (
      done.returncode, done.stdout[-3000:], done.stderr[-6000:])
  _, lines = read_output(prefix)
  return lines


@pytest.mark.parametrize('env', ['LOOPBACK', 'PROCESS'])
def test_java_timers_fire_in_order_and_global_panes_end_the_window(
    classpath, weir_server, tmp_path, env):
  """A key's timers fire in timestamp order across timer families (a timer
  re-arming every 10 minutes fires 5 times before the window-end timer of a
  family whose name sorts first), and a global-window GroupByKey's output is
  stamped at Java's GlobalWindow max timestamp: the lines equal DirectRunner's."""
  want = timer_order(classpath, tmp_path, 'direct', ['--runner=DirectRunner'])
  assert sum(want.values()) == 6, want
  got = timer_order(
      classpath, tmp_path, env.lower(),
      ['--runner=WeirRunner', '--jobEndpoint=%s' % weir_server.endpoint,
       '--weirBinary=%s' % WEIR_BIN, '--defaultEnvironmentType=%s' % env])
  assert got == want, 'weir: %s\ndirect: %s\n--- weir log\n%s' % (
      sorted(got.elements()), sorted(want.elements()), weir_server.log_tail())
