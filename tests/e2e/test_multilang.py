"""Multi-language pipelines on Weir, with `weir expansion-service`.

* Python -> Java: one Python pipeline with Java's GenerateSequence and a Java
  SqlTransform over Python rows (tests/e2e/pipelines_multilang.py xlang), the
  Java steps expanded by Beam's Java expansion service (2.71.0) whose
  environment is DOCKER (`apache/beam_java17_sdk:2.71.0`, run by Weir as
  `weir boot --java`) or EXTERNAL (a Java worker pool started beside it); the
  Python steps run LOOPBACK. Exact outputs against values computed here, and
  the PCollections that cross environments carry model coders (varint, row).
* Java -> Python: a Java pipeline submitted by WeirRunner (java/multilang
  PythonMap) whose Python step is expanded by Python's expansion service,
  DOCKER (`apache/beam_python3.x_sdk`, run as `weir boot --python`) or EXTERNAL
  (Beam's Python worker pool).

Needs scripts/setup_java.sh's java/expansion and java/multilang outputs.
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, WEIR_BIN, read_output, weir_jobs

PIPELINES = Path(__file__).resolve().with_name('pipelines_multilang.py')
JAVA = REPO / 'java'
EXPANSION_JARS = JAVA / 'expansion' / 'target' / 'jars'
MULTILANG_JAR = JAVA / 'multilang' / 'target' / 'weir-multilang-examples-0.1.0-SNAPSHOT.jar'
RUNNER_JAR = JAVA / 'target' / 'weir-runner-java-0.1.0-SNAPSHOT.jar'
TIMEOUT = 300


def _free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


class ExpansionService:
  """`weir expansion-service --sdk SDK --environment ENV` on a free port."""
  def __init__(self, sdk, environment, log_path):
    self.port = _free_port()
    self.log_path = log_path
    args = [str(WEIR_BIN), 'expansion-service', '--sdk', sdk,
            '--environment', environment, '--port', str(self.port)]
    if sdk == 'python':
      args += ['--python', sys.executable]
    self._log = open(log_path, 'wb')
    self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL,
                                 stdout=self._log, stderr=subprocess.STDOUT)
    deadline = time.time() + 180
    while True:
      assert self.proc.poll() is None, 'expansion service exited: %s' % self.log()
      try:
        socket.create_connection(('127.0.0.1', self.port), timeout=1).close()
        break
      except OSError:
        assert time.time() < deadline, 'expansion service not up: %s' % self.log()
        time.sleep(0.2)

  @property
  def address(self):
    return 'localhost:%d' % self.port

  def log(self):
    return Path(self.log_path).read_text(errors='replace')[-3000:]

  def stop(self):
    self.proc.terminate()
    try:
      self.proc.wait(30)
    except subprocess.TimeoutExpired:
      self.proc.kill()
      self.proc.wait()
    self._log.close()


@pytest.fixture(scope='module', params=['DOCKER', 'EXTERNAL'])
def java_expansion(request, tmp_path_factory):
  if not EXPANSION_JARS.is_dir():
    pytest.fail('%s is missing; run scripts/setup_java.sh' % EXPANSION_JARS)
  log = tmp_path_factory.mktemp('java-expansion') / 'expansion.log'
  service = ExpansionService('java', request.param, log)
  yield request.param, service
  service.stop()


@pytest.fixture(scope='module', params=['DOCKER', 'EXTERNAL'])
def python_expansion(request, tmp_path_factory):
  log = tmp_path_factory.mktemp('python-expansion') / 'expansion.log'
  service = ExpansionService('python', request.param, log)
  yield request.param, service
  service.stop()


def _job_logs(server):
  jobs = [l.split('\t')[0] for l in weir_jobs(server, 'list').splitlines()[1:]]
  return {job: weir_jobs(server, 'logs', job) for job in jobs}


def test_python_pipeline_with_java_generate_sequence_and_sql(
    java_expansion, weir_server, tmp_path):
  env, service = java_expansion
  out = tmp_path / 'out'
  out.mkdir()
  run = subprocess.run(
      [sys.executable, str(PIPELINES), 'xlang',
       '--expansion_service', service.address, '--output', str(out),
       '--runner=PortableRunner', '--job_endpoint=' + weir_server.endpoint,
       '--environment_type=LOOPBACK'],
      cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)
  assert run.returncode == 0, '%s\n--- expansion\n%s\n--- weir\n%s' % (
      run.stderr[-6000:], service.log(), weir_server.log_tail())

  _, squares = read_output(out / 'squares')
  assert squares == {'%d %d' % (x, x * x): 1 for x in range(25)}
  _, sql = read_output(out / 'sql')
  assert sql == {'%d N%d %s' % (i * 10, i, bytes([i, 255 - i]).hex()): 1
                 for i in range(6) if i != 3}

  # Data crossed between the Java and Python environments through the
  # runner, encoded with model coders both SDKs know.
  crossing = set(json.loads((out / 'coders.json').read_text()).values())
  assert 'beam:coder:varint:v1' in crossing, crossing
  assert 'beam:coder:row:v1' in crossing, crossing
  assert crossing <= {'beam:coder:varint:v1', 'beam:coder:row:v1',
                      'beam:coder:length_prefix:v1', 'beam:coder:bytes:v1',
                      'beam:coder:string_utf8:v1', 'beam:coder:kv:v1'}, crossing

  if env == 'DOCKER':
    note = 'image apache/beam_java17_sdk:2.71.0 is replaced by a native harness'
    assert any(note in log for log in _job_logs(weir_server).values())


def test_java_pipeline_with_a_python_step(python_expansion, weir_server, tmp_path):
  env, service = python_expansion
  for path in (RUNNER_JAR, MULTILANG_JAR):
    if not path.is_file():
      pytest.fail('%s is missing; run scripts/setup_java.sh' % path)
  classpath = ':'.join([
      str(RUNNER_JAR), (JAVA / 'target' / 'classpath.txt').read_text().strip(),
      str(MULTILANG_JAR)])
  words = ['alpha', 'Beta', 'gamma delta', 'é']
  output = tmp_path / 'upper.txt'
  fn = "lambda pcoll: pcoll | __import__('apache_beam').Map(lambda s: s.upper() + '!')"
  run = subprocess.run(
      ['java', '-cp', classpath, 'dev.weir.multilang.PythonMap',
       '--runner=WeirRunner', '--jobEndpoint=' + weir_server.endpoint,
       '--expansionService=' + service.address, '--words=' + ','.join(words),
       '--pythonFn=' + fn, '--output=' + str(output)],
      cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)
  assert run.returncode == 0, '%s\n--- expansion\n%s\n--- weir\n%s' % (
      run.stderr[-6000:], service.log(), weir_server.log_tail())
  assert output.is_file(), run.stderr[-5000:] + service.log()
  got = sorted(output.read_text(encoding='utf-8').splitlines())
  assert got == sorted(w.upper() + '!' for w in words)
  if env == 'DOCKER':
    assert 'is replaced by a native harness' in run.stderr
