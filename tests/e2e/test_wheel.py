"""The pip-installable Weir (python/package: weir-beam, module weir).

* test_wheel_sh: scripts/wheel.sh end to end (builds the wheel with maturin,
  installs it with apache-beam into a fresh venv, runs wordcount with
  --runner=weir.WeirRunner and compares it with DirectRunner).
* The rest use the module from the source tree (python/package on sys.path or
  PYTHONPATH) and target/release/weir: an explicit --job_endpoint starts no
  server, a server that cannot start says why, and a server outlives no
  client, even one killed with SIGKILL.
"""

import os
import signal
import subprocess
import sys
import time
from concurrent import futures

import pytest

from conftest import REPO
from conftest import WEIR_BIN
from conftest import read_output

PACKAGE = REPO / 'python' / 'package'
WHEEL_SH = REPO / 'scripts' / 'wheel.sh'


def _import_weir():
  if str(PACKAGE) not in sys.path:
    sys.path.insert(0, str(PACKAGE))
  import weir
  assert os.path.dirname(weir.__file__) == str(PACKAGE / 'weir'), weir.__file__
  return weir


def _env(**extra):
  env = dict(os.environ)
  for var in ('WEIR_BINARY', 'WEIR_BIN'):
    env.pop(var, None)
  env['PYTHONPATH'] = os.pathsep.join(
      [str(PACKAGE)] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
  env.update(extra)
  return env


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  try:  # a zombie is gone for our purposes
    with open('/proc/%d/stat' % pid) as f:
      return f.read().split(')')[-1].split()[0] != 'Z'
  except OSError:
    return False


@pytest.mark.timeout(900)
def test_wheel_sh():
  began = time.time()
  try:
    out = subprocess.run(
        ['bash', str(WHEEL_SH)], cwd=REPO, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=870)
  except subprocess.TimeoutExpired as e:
    pytest.fail('scripts/wheel.sh did not finish within 870 s; stdout so far:\n%s' % (
        (e.stdout or b'').decode('utf-8', 'replace')[-4000:] if isinstance(
            e.stdout, bytes) else (e.stdout or '')[-4000:]))
  assert out.returncode == 0, 'scripts/wheel.sh exit code %d\n--- stdout\n%s\n--- stderr\n%s' % (
      out.returncode, out.stdout[-4000:], out.stderr[-6000:])
  assert '[wheel] OK in' in out.stdout, out.stdout[-4000:]
  print('scripts/wheel.sh: %.0f s' % (time.time() - began))


def test_explicit_job_endpoint_starts_no_server(monkeypatch):
  """With --job_endpoint, WeirRunner is PortableRunner against it: it never
  looks for a binary nor starts a WeirJobServer."""
  weir = _import_weir()
  import grpc
  from apache_beam.options.pipeline_options import PipelineOptions
  from apache_beam.options.pipeline_options import PortableOptions
  from apache_beam.portability.api import beam_job_api_pb2_grpc

  def refuse(*args, **kwargs):
    raise AssertionError('WeirRunner started a server despite --job_endpoint')

  monkeypatch.setenv('WEIR_BINARY', '/nonexistent/weir')
  monkeypatch.setattr(weir.WeirJobServer, 'start', refuse)
  monkeypatch.setattr(weir.runner._server, 'find_binary', refuse)
  monkeypatch.setattr(subprocess, 'Popen', refuse)

  # Any gRPC server will do: creating the job service only waits until the
  # channel is ready.
  grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
  port = grpc_server.add_insecure_port('127.0.0.1:0')
  grpc_server.start()
  try:
    options = PipelineOptions(['--job_endpoint=127.0.0.1:%d' % port])
    runner = weir.WeirRunner()
    handle = runner.create_job_service(options)
    # Beam's stub for that endpoint, whose streams carry no deadline.
    assert type(handle.job_service) is weir.runner._StreamsRunToTheEnd, handle.job_service
    assert type(handle.job_service._stub) is beam_job_api_pb2_grpc.JobServiceStub
    # LOOPBACK by default, as PrismRunner; an explicit type is kept.
    runner.default_environment(options)
    assert options.view_as(PortableOptions).environment_type == 'LOOPBACK'
    process = PipelineOptions(['--job_endpoint=127.0.0.1:1', '--environment_type=PROCESS',
                               '--environment_config={"command": "/bin/true"}'])
    runner.default_environment(process)
    assert process.view_as(PortableOptions).environment_type == 'PROCESS'
  finally:
    grpc_server.stop(None)


def test_no_submission_environment_list_is_staged():
  """As Beam's local runners (DirectRunner, PrismRunner), WeirRunner stages
  no `pip freeze` list of the submission environment (Weir does not read
  it); Beam's PortableRunner does."""
  weir = _import_weir()
  from apache_beam.options.pipeline_options import PipelineOptions
  from apache_beam.runners.portability.portable_runner import PortableRunner

  def staged(runner, name):
    options = PipelineOptions(['--runner=' + name, '--job_endpoint=127.0.0.1:1',
                               '--environment_type=LOOPBACK'])
    return [a.role_payload for a in runner.default_environment(options).artifacts()]

  listed = lambda payloads: any(b'submission_environment_dependencies' in p for p in payloads)
  assert listed(staged(PortableRunner(), 'PortableRunner')), 'PortableRunner stages the list'
  assert not listed(staged(weir.WeirRunner(), 'weir.WeirRunner'))


def test_explicit_job_endpoint_runs_on_that_server(weir_server, tmp_path):
  """A whole pipeline with --runner=weir.WeirRunner --job_endpoint=...: runs on
  the session's weir serve; no binary to start is even findable."""
  text = tmp_path / 'in.txt'
  text.write_text('to be or not to be\nthat is the question\n')
  prefix = tmp_path / 'counts'
  out = subprocess.run(
      [sys.executable, '-m', 'apache_beam.examples.wordcount', '--runner=weir.WeirRunner',
       '--job_endpoint=%s' % weir_server.endpoint, '--input', str(text),
       '--output', str(prefix)],
      cwd=tmp_path, env=_env(WEIR_BINARY='/nonexistent/weir', PATH='/usr/bin:/bin'),
      stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-6000:] + '\n--- weir log\n' + weir_server.log_tail()
  assert 'Started ' not in out.stderr and 'weir.server' not in out.stderr, out.stderr[-3000:]
  _, lines = read_output(prefix)
  assert lines == {'to: 2': 1, 'be: 2': 1, 'or: 1': 1, 'not: 1': 1, 'that: 1': 1,
                   'is: 1': 1, 'the: 1': 1, 'question: 1': 1}, lines


def test_server_that_exits_at_once_says_so():
  weir = _import_weir()
  server = weir.WeirJobServer('/bin/false', start_timeout=30)
  with pytest.raises(RuntimeError, match='exited before it reported its port'):
    server.start()
  assert not server.alive()


def test_server_stops_when_its_client_is_killed(tmp_path):
  """The watchdog: SIGKILL of the Python process that started weir serve
  stops the server too."""
  client = subprocess.Popen(
      [sys.executable, '-c',
       'import time, weir\n'
       's = weir.WeirJobServer(weir.find_binary())\n'
       's.start()\n'
       'print(s.pid, s.endpoint, flush=True)\n'
       'time.sleep(300)\n'],
      cwd=tmp_path, env=_env(WEIR_BINARY=str(WEIR_BIN)), stdin=subprocess.DEVNULL,
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  try:
    line = client.stdout.readline()
    assert line, 'the client exited (code %s) without starting weir serve' % client.poll()
    pid = int(line.split()[0])
    with open('/proc/%d/cmdline' % pid, 'rb') as f:
      assert f.read().split(b'\0')[:2] == [bytes(WEIR_BIN), b'serve']
    assert _alive(pid)
  finally:
    client.send_signal(signal.SIGKILL)
    client.wait()
    client.stdout.close()
  deadline = time.time() + 15
  while _alive(pid) and time.time() < deadline:
    time.sleep(0.1)
  if _alive(pid):
    os.kill(pid, signal.SIGKILL)
    pytest.fail('weir serve (pid %d) outlived its SIGKILLed client by 15 s' % pid)


def test_server_stops_when_the_job_finishes(tmp_path):
  """A job run with WeirRunner and no --job_endpoint: its server is gone once
  wait_until_finish() returns, while result.state and result.metrics() still
  answer."""
  script = tmp_path / 'job.py'
  script.write_text(
      'import logging, os, sys\n'
      'logging.basicConfig(level=logging.INFO)\n'
      'import apache_beam as beam\n'
      'from apache_beam.metrics import Metrics\n'
      'from apache_beam.options.pipeline_options import PipelineOptions\n'
      'seen = Metrics.counter("test", "seen")\n'
      'def count(x):\n'
      '  seen.inc()\n'
      '  return x\n'
      'p = beam.Pipeline(options=PipelineOptions(["--runner=weir.WeirRunner"]))\n'
      '_ = p | beam.Create(range(7)) | beam.Map(count)\n'
      'result = p.run()\n'
      'print("state", result.wait_until_finish(), result.state, flush=True)\n'
      'kids = []\n'
      'for t in os.listdir("/proc/self/task"):\n'
      '  kids += open("/proc/self/task/%s/children" % t).read().split()\n'
      'print("children", " ".join(kids) or "-", flush=True)\n'
      'counters = result.metrics().query()["counters"]\n'
      'print("seen", sum(c.committed for c in counters if c.key.metric.name == "seen"))\n')
  out = subprocess.run(
      [sys.executable, str(script)], cwd=tmp_path, env=_env(WEIR_BINARY=str(WEIR_BIN)),
      stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-6000:]
  lines = dict(l.split(' ', 1) for l in out.stdout.splitlines() if ' ' in l)
  assert lines.get('state') == 'DONE DONE', out.stdout
  assert lines.get('seen') == '7', out.stdout
  # No child process (the watchdog, weir serve) is left after the job.
  assert lines.get('children') == '-', out.stdout
  assert 'INFO:weir.server:Started %s serve at' % WEIR_BIN in out.stderr, out.stderr[-3000:]
  assert 'INFO:weir.server:Stopped weir serve at' in out.stderr, out.stderr[-3000:]


def test_job_longer_than_job_server_timeout_finishes(tmp_path):
  """--job_server_timeout bounds Job API requests, not the run time (its
  help says so): a job that runs past it still ends DONE with its output on
  WeirRunner, where Beam's PortableRunner gives up with DEADLINE_EXCEEDED."""
  script = tmp_path / 'job.py'
  script.write_text(
      'import sys, time\n'
      'import apache_beam as beam\n'
      'from apache_beam.options.pipeline_options import PipelineOptions\n'
      'def slow(x):\n'
      '  time.sleep(12)\n'
      '  return x * 2\n'
      'def show(x):\n'
      '  print("out", x, flush=True)\n'
      'p = beam.Pipeline(options=PipelineOptions(sys.argv[1:]))\n'
      '_ = p | beam.Create([21]) | beam.Map(slow) | beam.Map(show)\n'
      'print("state", p.run().wait_until_finish(), flush=True)\n')
  out = subprocess.run(
      [sys.executable, str(script), '--runner=weir.WeirRunner', '--job_server_timeout=5'],
      cwd=tmp_path, env=_env(WEIR_BINARY=str(WEIR_BIN)), stdin=subprocess.DEVNULL,
      capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-6000:]
  assert out.stdout.splitlines() == ['out 42', 'state DONE'], out.stdout
