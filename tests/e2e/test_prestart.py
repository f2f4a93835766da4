"""SDK harnesses started at Prepare (issue 12's fixed cost): for a Python
LOOPBACK job, whose worker pool serves in the client before it calls
Prepare, Weir asks that pool for its harnesses while the client stages and
calls Run. These tests play the client over the raw Job API with Beam's own
in-process worker pool: the harness connects before Run; a job cancelled
before Run stops it; a pool that only serves from Run on still runs the job
(its harnesses are asked for again at Run)."""

import socket
import threading
import time

import apache_beam as beam
import grpc
from apache_beam.portability.api import beam_job_api_pb2
from apache_beam.portability.api import beam_job_api_pb2_grpc
from apache_beam.runners.worker import worker_pool_main
from apache_beam.transforms.environments import ExternalEnvironment
from google.protobuf import struct_pb2

DONE = beam_job_api_pb2.JobState.DONE
CANCELLED = beam_job_api_pb2.JobState.CANCELLED


def start_pool(monkeypatch, port=0):
  """Beam's LOOPBACK worker pool, in this process: its harnesses are threads
  named run_worker_<worker id>. Returns its address, its server and the
  worker ids of the StartWorker requests it gets, in order."""
  servicer = worker_pool_main.BeamFnExternalWorkerPoolServicer
  started = []
  start_worker = servicer.StartWorker

  def counting(self, request, context):
    started.append(request.worker_id)
    return start_worker(self, request, context)

  monkeypatch.setattr(servicer, 'StartWorker', counting)
  address, server = servicer.start(use_process=False, port=port)
  return address, server, started


def harness_threads():
  return [t for t in threading.enumerate() if t.name.startswith('run_worker_')]


def wait_for(what, timeout=20):
  deadline = time.time() + timeout
  while time.time() < deadline:
    value = what()
    if value:
      return value
    time.sleep(0.05)
  return what()


def loopback_job(address, out):
  """A Create | Map pipeline whose environment is the pool at `address`,
  and the options a Python client sends for --environment_type=LOOPBACK."""
  p = beam.Pipeline()
  _ = (p | beam.Create(['a', 'b', 'c'])
       | beam.Map(lambda x, out=out: open('%s-%s' % (out, x), 'w').close()))
  proto = p.to_runner_api(default_environment=ExternalEnvironment(address))
  options = struct_pb2.Struct()
  options.update({'beam:option:environment_type:v1': 'LOOPBACK',
                  'beam:option:job_name:v1': 'prestart'})
  return proto, options


def prepare(stub, pipeline, options):
  return stub.Prepare(beam_job_api_pb2.PrepareJobRequest(
      pipeline=pipeline, job_name='prestart', pipeline_options=options), timeout=30)


def state(stub, job_id):
  return stub.GetState(beam_job_api_pb2.GetJobStateRequest(job_id=job_id), timeout=10).state


def prepare_on_pool(stub, address, out):
  """Prepares loopback_job on the pool at `address`; returns the job's id
  and the harness threads that started since, once there are some (none
  after 20 s)."""
  before = set(harness_threads())
  proto, options = loopback_job(address, out)
  job_id = prepare(stub, proto, options).preparation_id
  return job_id, wait_for(lambda: set(harness_threads()) - before)


def test_a_loopback_harness_connects_before_run_and_the_job_runs_on_it(
    weir_server, tmp_path, monkeypatch):
  address, pool, asked = start_pool(monkeypatch)
  try:
    with grpc.insecure_channel(weir_server.endpoint) as channel:
      stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
      job_id, started = prepare_on_pool(stub, address, str(tmp_path / 'out'))
      assert len(started) == 1, 'no SDK harness started at Prepare: %s' % started
      assert len(asked) == 1, asked
      assert state(stub, job_id) == beam_job_api_pb2.JobState.STOPPED
      stub.Run(beam_job_api_pb2.RunJobRequest(preparation_id=job_id), timeout=30)
      assert wait_for(lambda: state(stub, job_id) == DONE), state(stub, job_id)
      # The job ran on the harness started at Prepare: no other was asked for.
      assert len(asked) == 1, asked
      assert sorted(p.name for p in tmp_path.iterdir()) == ['out-a', 'out-b', 'out-c']
      assert wait_for(lambda: not any(t.is_alive() for t in started))
  finally:
    pool.stop(0)


def test_a_job_cancelled_before_run_stops_its_prestarted_harness(
    weir_server, tmp_path, monkeypatch):
  address, pool, _ = start_pool(monkeypatch)
  try:
    with grpc.insecure_channel(weir_server.endpoint) as channel:
      stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
      job_id, started = prepare_on_pool(stub, address, str(tmp_path / 'out'))
      assert len(started) == 1, started
      stub.Cancel(beam_job_api_pb2.CancelJobRequest(job_id=job_id), timeout=10)
      assert state(stub, job_id) == CANCELLED
      # Its control stream ends: the harness thread returns.
      assert wait_for(lambda: not any(t.is_alive() for t in started)), started
      assert not list(tmp_path.iterdir())
  finally:
    pool.stop(0)


def test_a_pool_that_serves_only_from_run_on_still_runs_the_job(
    weir_server, tmp_path, monkeypatch):
  with socket.socket() as s:
    s.bind(('localhost', 0))
    port = s.getsockname()[1]
  with grpc.insecure_channel(weir_server.endpoint) as channel:
    stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
    proto, options = loopback_job('localhost:%d' % port, str(tmp_path / 'out'))
    job_id = prepare(stub, proto, options).preparation_id
    time.sleep(1)  # the harness asked for at Prepare finds no pool
    _, pool, asked = start_pool(monkeypatch, port)
    try:
      stub.Run(beam_job_api_pb2.RunJobRequest(preparation_id=job_id), timeout=30)
      assert wait_for(lambda: state(stub, job_id) == DONE, timeout=60), state(stub, job_id)
      assert sorted(p.name for p in tmp_path.iterdir()) == ['out-a', 'out-b', 'out-c']
      assert len(asked) == 1, asked   # at Run: the pool was not there at Prepare
    finally:
      pool.stop(0)
    messages = [m.message_response.message_text for m in stub.GetMessageStream(
        beam_job_api_pb2.JobMessagesRequest(job_id=job_id), timeout=10)
                if m.HasField('message_response')]
  assert any('asked for at Prepare did not start' in m and 'cannot reach worker pool' in m
             for m in messages), messages
