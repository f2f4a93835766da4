"""WeirRunner: Beam Python's PortableRunner, starting a local Weir itself."""

import shlex
import threading

from apache_beam.options import pipeline_options
from apache_beam.runners.portability import portable_runner

from weir import server as _server


class WeirOptions(pipeline_options.PipelineOptions):
  """Pipeline options of WeirRunner (used only when it starts the server).

  * ``--weir_binary=PATH``: the ``weir`` executable to start (default: see
    :func:`weir.find_binary`).
  * ``--weir_serve_args="FLAGS"``: more ``weir serve`` flags, as one
    shell-quoted string, e.g. ``--weir_serve_args="--workers 2"``.

  Beam's ``--job_port`` picks the server's port (default 0: a free one) and
  ``--job_server_timeout`` bounds how long it may take to start.
  """
  @classmethod
  def _add_argparse_args(cls, parser):
    parser.add_argument(
        '--weir_binary',
        default=None,
        help='The weir executable WeirRunner starts when no --job_endpoint is '
        'given. Default: $WEIR_BINARY, $WEIR_BIN, the one the weir-beam wheel '
        'installed, weir next to sys.executable, weir on the PATH.')
    parser.add_argument(
        '--weir_serve_args',
        default=None,
        help='More flags for the `weir serve` WeirRunner starts, as one '
        'shell-quoted string (e.g. "--workers 2").')


class WeirRunner(portable_runner.PortableRunner):
  """Runs pipelines on Weir: ``--runner=weir.WeirRunner``.

  Without ``--job_endpoint`` it starts ``weir serve`` on this machine for
  each pipeline it runs (the binary from :func:`weir.find_binary`, on a free
  port), submits the job there, and stops the server once the job reaches a
  terminal state (seen by ``wait_until_finish()``, ``with Pipeline()``, or
  ``cancel()``), after keeping the job's final state and metrics so
  ``result.state`` and ``result.metrics()`` still answer. A server whose job
  was never waited for is stopped when the interpreter exits, and a watchdog
  stops it if the interpreter dies, so none is left running. A job that
  cannot be submitted stops its server at once.

  With ``--job_endpoint=HOST:PORT`` it is Beam's PortableRunner against that
  server and starts nothing.

  Either way the default environment is LOOPBACK (SDK harnesses in this
  process), as with PrismRunner, unless ``--environment_type`` is given.

  Either way ``--job_server_timeout`` bounds each Job API request, not the
  job's run time, as that option's help says: the client follows the job's
  state and messages for as long as the job runs. (Beam's PortableRunner
  gives those two streams the option as a deadline, so it gives up on any
  job longer than that, 300 s by default.)
  """
  def __init__(self):
    super().__init__()
    self._local = threading.local()

  def default_environment(self, options):
    """LOOPBACK unless ``--environment_type`` (or
    ``--output_executable_path``) is set, then Beam's default handling.

    Like Beam's local runners (DirectRunner, PrismRunner), it does not stage
    the list of packages installed where the pipeline is submitted (a
    ``pip freeze``, about half a second): Weir does not read it."""
    debug = options.view_as(pipeline_options.DebugOptions)
    if not debug.lookup_experiment('disable_logging_submission_environment'):
      debug.add_experiment('disable_logging_submission_environment')
    portable_options = options.view_as(pipeline_options.PortableOptions)
    if (not portable_options.environment_type and
        not portable_options.output_executable_path):
      portable_options.environment_type = 'LOOPBACK'
    return super().default_environment(options)

  def run_portable_pipeline(self, pipeline, options):
    """PortableRunner's, with a ``weir serve`` started for this pipeline when
    no ``--job_endpoint`` is given (stopped if submission fails)."""
    if options.view_as(pipeline_options.PortableOptions).job_endpoint:
      return super().run_portable_pipeline(pipeline, options)
    job_server = self._new_job_server(options)
    self._local.job_server = job_server
    try:
      return super().run_portable_pipeline(pipeline, options)
    except BaseException:
      job_server.stop()
      raise
    finally:
      self._local.job_server = None

  def start_and_replace_loopback_environments(self, pipeline, options):
    """PortableRunner's (a LOOPBACK worker pool), plus stopping this run's
    server among the callbacks Beam runs when the job is over."""
    callbacks = portable_runner.PortableRunner.start_and_replace_loopback_environments(
        pipeline, options)
    job_server = getattr(self._local, 'job_server', None)
    if job_server is not None:
      callbacks.append(job_server.finish)
    return callbacks

  def create_job_service_handle(self, job_service, options):
    """PortableRunner's, on a Job API stub that sets no deadline on
    GetStateStream and GetMessageStream (see the class doc)."""
    return super().create_job_service_handle(_StreamsRunToTheEnd(job_service), options)

  def default_job_server(self, options):
    """The ``weir serve`` for this run (Beam calls this only when no
    ``--job_endpoint`` is given)."""
    job_server = getattr(self._local, 'job_server', None)
    if job_server is None:  # called outside run_portable_pipeline
      job_server = self._new_job_server(options)
    return job_server

  @staticmethod
  def _new_job_server(options):
    weir_options = options.view_as(WeirOptions)
    return _server.WeirJobServer(
        _server.find_binary(weir_options.weir_binary),
        job_port=options.view_as(pipeline_options.JobServerOptions).job_port,
        serve_args=shlex.split(weir_options.weir_serve_args or ''),
        start_timeout=options.view_as(
            pipeline_options.PortableOptions).job_server_timeout)


class _StreamsRunToTheEnd:
  """A Job API stub (``JobServiceStub``) whose GetStateStream and
  GetMessageStream calls carry no deadline, whatever ``timeout`` the caller
  gives; every other call goes to the stub unchanged."""
  def __init__(self, stub):
    self._stub = stub

  def __getattr__(self, name):
    return getattr(self._stub, name)

  def GetStateStream(self, request, timeout=None, **kwargs):  # pylint: disable=unused-argument
    return self._stub.GetStateStream(request, **kwargs)

  def GetMessageStream(self, request, timeout=None, **kwargs):  # pylint: disable=unused-argument
    return self._stub.GetMessageStream(request, **kwargs)
