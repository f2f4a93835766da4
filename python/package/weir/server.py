"""The local ``weir serve`` that WeirRunner starts: finding the binary,
starting it, and stopping it.

* :func:`find_binary` says which ``weir`` executable to run.
* :class:`WeirJobServer` is one ``weir serve`` process, as a Beam
  ``JobServer``: ``start()`` launches it on a free port (or ``job_port``) and
  returns a Job API stub, ``stop()`` ends it. WeirRunner starts one per job and
  stops it when the job reaches a terminal state; see its docstring.

The server runs under a small watchdog (``weir/_watchdog.py``) that stops it
when this Python process exits, however it exits, so no server is left
behind. Its output goes to the ``weir.serve`` logger: weir's WARN and ERROR
log lines as warnings and errors, its other log lines at DEBUG, plain lines
(``weir: ...``) at INFO and panics at ERROR.
"""

import atexit
import collections
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import time

import grpc
from apache_beam.portability.api import beam_job_api_pb2
from apache_beam.portability.api import beam_job_api_pb2_grpc
from apache_beam.runners.portability import job_server

_LOGGER = logging.getLogger(__name__)
_SERVER_LOGGER = logging.getLogger('weir.serve')

#: The distribution (pip name) that installs the ``weir`` binary.
DISTRIBUTION = 'weir-beam'
#: Environment variables naming the binary, checked in this order.
BINARY_ENV_VARS = ('WEIR_BINARY', 'WEIR_BIN')

_EXE = 'weir.exe' if os.name == 'nt' else 'weir'
_WATCHDOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), '_watchdog.py')
_LISTENING = re.compile(r'Beam Job API listening on (\S+):(\d+)\s*$')
_WATCHDOG_PID = re.compile(r'^weir watchdog: started pid (\d+)$')
_TRACING_LINE = re.compile(r'^\S+\s+(TRACE|DEBUG|INFO|WARN|ERROR)\s')
_LEVELS = {'WARN': logging.WARNING, 'ERROR': logging.ERROR}
_TERMINAL = frozenset([
    beam_job_api_pb2.JobState.DONE,
    beam_job_api_pb2.JobState.FAILED,
    beam_job_api_pb2.JobState.CANCELLED,
    beam_job_api_pb2.JobState.UPDATED,
    beam_job_api_pb2.JobState.DRAINED,
])


def _level(line):
  """The logging level for one line of weir's output: its tracing level
  (WARN, ERROR; the rest DEBUG), ERROR for a panic or a fatal `Error:`,
  INFO for its other plain lines."""
  m = _TRACING_LINE.match(line)
  if m:
    return _LEVELS.get(m.group(1), logging.DEBUG)
  if line.startswith('Error:') or ' panicked at ' in line:
    return logging.ERROR
  return logging.INFO


def _is_executable(path):
  return bool(path) and os.path.isfile(path) and os.access(path, os.X_OK)


def _wheel_binary():
  """The ``weir`` that pip installed with this package, read from the
  distribution's RECORD (right for venvs, --user, --prefix and --target
  installs alike); None when the package is not installed as a distribution.
  """
  try:
    from importlib import metadata
    files = metadata.distribution(DISTRIBUTION).files or ()
  except Exception:  # pylint: disable=broad-except
    return None
  for f in files:
    if f.name == _EXE and len(f.parts) > 1 and f.parts[-2] in ('bin', 'Scripts'):
      path = os.path.normpath(str(f.locate()))
      if _is_executable(path):
        return path
  return None


def _scripts_dirs():
  """Where pip puts scripts for this interpreter: its scheme's scripts
  folder, the user scheme's, and the folder of ``sys.executable``."""
  dirs = []
  try:
    dirs.append(sysconfig.get_path('scripts'))
  except KeyError:
    pass
  try:
    user_scheme = (
        sysconfig.get_preferred_scheme('user') if hasattr(
            sysconfig, 'get_preferred_scheme') else os.name + '_user')
    dirs.append(sysconfig.get_path('scripts', user_scheme))
  except KeyError:
    pass
  if sys.executable:
    dirs.append(os.path.dirname(os.path.abspath(sys.executable)))
  seen = []
  for d in dirs:
    if d and d not in seen:
      seen.append(d)
  return seen


def find_binary(explicit=None):
  """Returns the path of the ``weir`` binary WeirRunner runs.

  Looks, in order, at: ``explicit`` (the ``--weir_binary`` option); the
  environment variables ``WEIR_BINARY``, then ``WEIR_BIN`` (the name the Java
  WeirRunner and Weir's scripts read); the binary installed by the
  ``weir-beam`` wheel; ``weir`` in this interpreter's scripts folders (next to
  ``sys.executable``); ``weir`` on the ``PATH``. An explicit path or variable
  that names no executable file is an error, not a reason to look further.

  Raises:
    FileNotFoundError: naming every place it looked.
  """
  if explicit:
    if _is_executable(explicit):
      return os.path.abspath(explicit)
    raise FileNotFoundError(
        '--weir_binary=%s is not an executable file' % explicit)
  for var in BINARY_ENV_VARS:
    value = os.environ.get(var)
    if value:
      if _is_executable(value):
        return os.path.abspath(value)
      raise FileNotFoundError('$%s=%s is not an executable file' % (var, value))
  path = _wheel_binary()
  if path:
    return path
  dirs = _scripts_dirs()
  for d in dirs:
    candidate = os.path.join(d, _EXE)
    if _is_executable(candidate):
      return candidate
  path = shutil.which('weir')
  if path:
    return os.path.abspath(path)
  raise FileNotFoundError(
      'no weir binary: not given by --weir_binary, $WEIR_BINARY or $WEIR_BIN, '
      'not installed by the %s wheel, not in %s, not on the PATH. Install it '
      '(pip install %s), or give --job_endpoint=HOST:PORT of a running '
      '`weir serve`' % (DISTRIBUTION, ', '.join(dirs) or '-', DISTRIBUTION))


class _JobService(object):
  """The Job API stub WeirRunner hands to Beam for a server it started.

  While the server runs, every call goes to it; the stub notes the ids of the
  jobs it ran. :meth:`WeirJobServer.finish` fetches each job's final state and
  metrics before stopping the server, so afterwards ``GetState``,
  ``GetJobMetrics`` and ``Cancel`` of those jobs (``result.state``,
  ``result.metrics()``, ``result.cancel()``) answer from that copy; any other
  call raises RuntimeError saying the server has stopped.
  """
  def __init__(self, stub, endpoint):
    self._stub = stub
    self._endpoint = endpoint
    self._lock = threading.Lock()
    self._job_ids = []
    self._states = {}
    self._metrics = {}
    self._cancelled = set()
    self._stopped = False

  def Run(self, request, *args, **kwargs):  # pylint: disable=invalid-name
    response = self._live('Run').Run(request, *args, **kwargs)
    with self._lock:
      self._job_ids.append(response.job_id)
    return response

  def GetState(self, request, *args, **kwargs):  # pylint: disable=invalid-name
    with self._lock:
      if self._stopped and request.job_id in self._states:
        return beam_job_api_pb2.JobStateEvent(state=self._states[request.job_id])
    return self._live('GetState').GetState(request, *args, **kwargs)

  def GetJobMetrics(self, request, *args, **kwargs):  # pylint: disable=invalid-name
    with self._lock:
      if self._stopped and request.job_id in self._metrics:
        return self._metrics[request.job_id]
    return self._live('GetJobMetrics').GetJobMetrics(request, *args, **kwargs)

  def Cancel(self, request, *args, **kwargs):  # pylint: disable=invalid-name
    with self._lock:
      if self._stopped and request.job_id in self._states:
        return beam_job_api_pb2.CancelJobResponse(
            state=self._states[request.job_id])
    response = self._live('Cancel').Cancel(request, *args, **kwargs)
    with self._lock:
      self._cancelled.add(request.job_id)
    return response

  def __getattr__(self, name):
    if name.startswith('_'):
      raise AttributeError(name)
    return getattr(self._live(name), name)

  def _live(self, method):
    if self._stopped:
      raise RuntimeError(
          'JobService.%s: the weir serve at %s that WeirRunner started for '
          'this pipeline has stopped (it stops when its job finishes)' %
          (method, self._endpoint))
    return self._stub

  def _freeze(self, settle_seconds):
    """Fetches the final state and metrics of the jobs run through this stub
    (waiting up to ``settle_seconds`` for a cancelled job that is still
    stopping), then answers from them only."""
    with self._lock:
      job_ids = list(self._job_ids)
      cancelled = set(self._cancelled)
    states, metrics = {}, {}
    for job_id in job_ids:
      try:
        deadline = time.time() + (settle_seconds if job_id in cancelled else 0)
        while True:
          state = self._stub.GetState(
              beam_job_api_pb2.GetJobStateRequest(job_id=job_id),
              timeout=10).state
          if state in _TERMINAL or time.time() > deadline:
            break
          time.sleep(0.1)
        states[job_id] = state
        metrics[job_id] = self._stub.GetJobMetrics(
            beam_job_api_pb2.GetJobMetricsRequest(job_id=job_id), timeout=30)
      except grpc.RpcError as e:
        _LOGGER.warning(
            'could not read the final state or metrics of job %s from %s: %s',
            job_id, self._endpoint, e)
    with self._lock:
      self._states.update(states)
      self._metrics.update(metrics)
      self._stopped = True


class WeirJobServer(job_server.JobServer):
  """One ``weir serve`` process on this machine, as a Beam ``JobServer``.

  Args:
    binary: the ``weir`` executable (see :func:`find_binary`).
    job_port: the port to serve on; 0 (the default) lets weir pick a free
      one, which it reports on stderr (``weir: Beam Job API listening on
      HOST:PORT``).
    serve_args: further ``weir serve`` flags, e.g. ``['--workers', '2']``.
    start_timeout: seconds to wait for the server to answer.

  ``start()`` launches the server (unless it is running) and returns a Job
  API stub; ``stop()`` ends it (SIGTERM, then SIGKILL after 10 s) and is also
  registered with ``atexit`` while the server runs. ``finish()`` is what WeirRunner calls when the
  job is over: it keeps the job's final state and metrics, then stops.
  """
  def __init__(self, binary, job_port=0, serve_args=(), start_timeout=60):
    self.binary = binary
    self.job_port = int(job_port or 0)
    self.serve_args = [str(a) for a in serve_args]
    self.start_timeout = float(start_timeout)
    self._lock = threading.Lock()
    self._process = None
    self._watched = False
    self._pid = None
    self._endpoint = None
    self._channel = None
    self._service = None
    self._tail = collections.deque(maxlen=40)

  @property
  def command(self):
    """The ``weir serve`` command line this server runs."""
    return [self.binary, 'serve', '--job_port', str(self.job_port)] + self.serve_args

  @property
  def endpoint(self):
    """``host:port`` of the Job API once started, else None."""
    return self._endpoint

  @property
  def pid(self):
    """Process id of ``weir serve`` once started, else None."""
    return self._pid

  def alive(self):
    """Whether the server process is running."""
    return self._process is not None and self._process.poll() is None

  def start(self):
    """Starts ``weir serve`` unless it is running; returns the Job API stub.

    Raises:
      RuntimeError: when the server exits, or does not answer within
        ``start_timeout`` seconds (the message has the end of its output).
    """
    with self._lock:
      if self._service is None:
        try:
          self._start()
        except BaseException:
          self._stop()
          raise
      return self._service

  def stop(self):
    """Stops the server now (idempotent). Unlike :meth:`finish` it keeps
    nothing: later calls on the stub raise RuntimeError."""
    with self._lock:
      self._stop()

  def finish(self):
    """Keeps the final state and metrics of the jobs run on this server, then
    stops it. WeirRunner calls this when its job reaches a terminal state."""
    with self._lock:
      if self._service is not None and self.alive():
        self._service._freeze(settle_seconds=10)  # pylint: disable=protected-access
      self._stop()

  def _start(self):
    env = dict(os.environ)
    env.setdefault('NO_COLOR', '1')
    if sys.executable and os.path.isfile(_WATCHDOG):
      argv = [sys.executable, '-I', '-S', _WATCHDOG, '--'] + self.command
      self._watched = True
    else:  # e.g. an embedded interpreter: no watchdog, atexit only
      argv = self.command
      self._watched = False
    _LOGGER.debug('starting %s', ' '.join(argv))
    ready = threading.Event()
    found = {}
    self._process = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env)
    if not self._watched:
      self._pid = self._process.pid
    atexit.register(self.stop)

    def read_output(stream):
      for raw in iter(stream.readline, b''):
        line = raw.decode('utf-8', 'backslashreplace').rstrip()
        if self._watched and self._pid is None:
          m = _WATCHDOG_PID.match(line)
          if m:
            self._pid = int(m.group(1))
            continue
        listening = _LISTENING.search(line)
        if listening and 'endpoint' not in found:
          found['endpoint'] = (listening.group(1), listening.group(2))
          ready.set()
          _SERVER_LOGGER.debug('%s', line)
          continue
        if not ready.is_set():
          self._tail.append(line)
        _SERVER_LOGGER.log(_level(line), '%s', line)
      stream.close()
      ready.set()  # the server's output ended: it exited

    threading.Thread(
        target=read_output, args=(self._process.stdout,), name='weir-serve-output',
        daemon=True).start()

    deadline = time.time() + self.start_timeout
    ready.wait(self.start_timeout)
    if 'endpoint' not in found:
      self._fail('exited before it reported its port' if ready.is_set() else
                 'reported no port within %.0f s' % self.start_timeout)
    host, port = found['endpoint']
    if host in ('0.0.0.0', '[::]', '::'):
      host = 'localhost'
    self._endpoint = '%s:%s' % (host, port)
    self._channel = grpc.insecure_channel(
        self._endpoint,
        options=[('grpc.max_receive_message_length', -1),
                 ('grpc.max_send_message_length', -1)])
    try:
      grpc.channel_ready_future(self._channel).result(
          timeout=max(1.0, deadline - time.time()))
    except grpc.FutureTimeoutError:
      self._fail('did not answer on %s within %.0f s' %
                 (self._endpoint, self.start_timeout))
    self._service = _JobService(
        beam_job_api_pb2_grpc.JobServiceStub(self._channel), self._endpoint)
    _LOGGER.info(
        'Started %s serve at %s (pid %s)', self.binary, self._endpoint, self._pid)

  def _fail(self, what):
    code = self._process.poll() if self._process else None
    raise RuntimeError(
        '`%s` %s%s; its output:\n%s' %
        (' '.join(self.command), what,
         '' if code is None else ' (exit code %s)' % code,
         '\n'.join(self._tail) or '<none>'))

  def _stop(self):
    self._service = None
    if self._channel is not None:
      self._channel.close()
      self._channel = None
    process, self._process = self._process, None
    if process is None:
      return
    atexit.unregister(self.stop)
    if process.poll() is None:
      if self._watched:
        # EOF on its stdin: the watchdog stops weir, waits, and exits.
        try:
          process.stdin.close()
        except OSError:
          pass
      else:
        process.terminate()
      try:
        process.wait(15)
      except subprocess.TimeoutExpired:
        process.terminate()
        try:
          process.wait(5)
        except subprocess.TimeoutExpired:
          process.kill()
          process.wait()
    try:
      process.stdin.close()
    except OSError:
      pass
    if self._endpoint:
      _LOGGER.info('Stopped weir serve at %s (pid %s)', self._endpoint, self._pid)
