"""Artifact staging over the raw Job API, misused as a client could: Run
before (or during) staging, a second staging stream, Cancel while a client
stages. Each is refused or ended with a clear status naming the job, and
the server goes on serving."""

import queue
import time

import grpc
import pytest
from apache_beam.portability.api import beam_artifact_api_pb2
from apache_beam.portability.api import beam_artifact_api_pb2_grpc
from apache_beam.portability.api import beam_job_api_pb2
from apache_beam.portability.api import beam_job_api_pb2_grpc

from test_limits import _stage, _with_dependency, pipeline_with, prepare

STOPPED = beam_job_api_pb2.JobState.STOPPED
CANCELLED = beam_job_api_pb2.JobState.CANCELLED


def run(server, job_id):
  """The error of a Run that must be refused."""
  with grpc.insecure_channel(server.endpoint) as channel:
    stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
    with pytest.raises(grpc.RpcError) as e:
      stub.Run(beam_job_api_pb2.RunJobRequest(preparation_id=job_id), timeout=10)
    return e.value


def state(server, job_id):
  with grpc.insecure_channel(server.endpoint) as channel:
    return beam_job_api_pb2_grpc.JobServiceStub(channel).GetState(
        beam_job_api_pb2.GetJobStateRequest(job_id=job_id), timeout=10).state


class OpenStaging:
  """A staging stream that answers nothing after its first message: the
  server's first request (resolve the artifacts) is read, then the stream
  stays open until close()."""

  def __init__(self, channel, token):
    self.hold = queue.Queue()

    def answers():
      yield beam_artifact_api_pb2.ArtifactResponseWrapper(staging_token=token)
      self.hold.get()

    stub = beam_artifact_api_pb2_grpc.ArtifactStagingServiceStub(channel)
    self.responses = stub.ReverseArtifactRetrievalService(answers(), timeout=30)

  def first(self):
    return next(self.responses)

  def give_up(self):
    """Ends the client's side of the stream (half-close)."""
    self.hold.put(None)

  def close(self):
    self.give_up()
    self.responses.cancel()


def test_run_refuses_a_job_whose_artifacts_were_never_staged(weir_server):
  job = prepare(weir_server, _with_dependency())
  e = run(weir_server, job.preparation_id)
  assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e.details()
  assert e.details() == (
      'job %s: environment "env" lists 1 artifact(s) that were never staged: stage them '
      'through the ArtifactStagingService endpoint and staging_session_token that Prepare '
      'returned, then call Run' % job.preparation_id), e.details()
  # Refused, not started: the job is still prepared.
  assert state(weir_server, job.preparation_id) == STOPPED


def test_run_and_a_second_stream_wait_for_staging_and_a_failed_staging_blocks_run(weir_server):
  job = prepare(weir_server, _with_dependency())
  token = job.staging_session_token
  with grpc.insecure_channel(weir_server.endpoint) as channel:
    first = OpenStaging(channel, token)
    assert first.first().HasField('resolve_artifact')
    e = run(weir_server, job.preparation_id)
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e.details()
    assert e.details() == (
        'job %s is still staging its artifacts: call Run once the client\'s '
        'ReverseArtifactRetrievalService stream has ended' % job.preparation_id), e.details()
    second = OpenStaging(channel, token)
    with pytest.raises(grpc.RpcError) as refused:
      second.first()
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value.details()
    assert refused.value.details() == (
        'job %s\'s artifacts are already being staged by another stream' % job.preparation_id)
    second.close()
    # The client gives up half way: staging failed, and Run says so.
    first.give_up()
    deadline = time.time() + 10
    while True:
      e = run(weir_server, job.preparation_id)
      if 'still staging' not in e.details() or time.time() > deadline:
        break
      time.sleep(0.1)
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e.details()
    assert e.details() == (
        'job %s\'s artifact staging failed (client closed the staging stream early): '
        'prepare the job again' % job.preparation_id), e.details()
    first.close()


def test_cancel_ends_a_staging_stream(weir_server):
  job = prepare(weir_server, _with_dependency())
  with grpc.insecure_channel(weir_server.endpoint) as channel:
    staging = OpenStaging(channel, job.staging_session_token)
    assert staging.first().HasField('resolve_artifact')
    stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
    stub.Cancel(beam_job_api_pb2.CancelJobRequest(job_id=job.preparation_id), timeout=10)
    began = time.time()
    with pytest.raises(grpc.RpcError) as e:
      next(staging.responses)
    assert time.time() - began < 2
    assert e.value.code() == grpc.StatusCode.CANCELLED, e.value.details()
    assert e.value.details() == (
        'job %s: the job was cancelled (or forgotten) before its artifacts were staged'
        % job.preparation_id), e.value.details()
    staging.close()
  assert state(weir_server, job.preparation_id) == CANCELLED
  # A pipeline with nothing to stage still runs without a staging stream.
  plain = prepare(weir_server, pipeline_with())
  with grpc.insecure_channel(weir_server.endpoint) as channel:
    stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
    stub.Run(beam_job_api_pb2.RunJobRequest(preparation_id=plain.preparation_id), timeout=10)
    deadline = time.time() + 30
    while state(weir_server, plain.preparation_id) != beam_job_api_pb2.JobState.DONE:
      assert time.time() < deadline, state(weir_server, plain.preparation_id)
      time.sleep(0.1)


def test_a_crashed_servers_staged_files_go_when_the_next_server_starts(tmp_path):
  from conftest import start_weir_serve, serving
  staging = tmp_path / 'staging'
  flags = ['--staging_dir', staging, '--serve_http=false']
  crashed = start_weir_serve(tmp_path / 'crashed.log', flags)
  with serving(crashed):
    job = prepare(crashed, _with_dependency())
    _stage(crashed, job.staging_session_token, [b'left behind'])
    left = [p for p in staging.rglob('*') if p.is_file() and p.read_bytes() == b'left behind']
    assert len(left) == 1, sorted(staging.rglob('*'))
    assert job.preparation_id in str(left[0])
    crashed.proc.kill()  # no chance to clean up
    crashed.proc.wait(timeout=10)
  assert left[0].exists()
  # A second server, running meanwhile, keeps its own folder through the next start.
  alive = start_weir_serve(tmp_path / 'alive.log', flags)
  with serving(alive):
    kept = prepare(alive, _with_dependency())
    _stage(alive, kept.staging_session_token, [b'in use'])
    in_use = [p for p in staging.rglob('*') if p.is_file() and p.read_bytes() == b'in use']
    assert len(in_use) == 1
    assert not left[0].exists()
    assert 'no longer running' in open(tmp_path / 'alive.log').read()
    third = start_weir_serve(tmp_path / 'third.log', flags)
    with serving(third):
      assert in_use[0].exists()


def test_cancel_before_run_removes_the_staged_artifacts(weir_server):
  job = prepare(weir_server, _with_dependency())
  data = b'staged for %s' % job.preparation_id.encode()
  _stage(weir_server, job.staging_session_token, [data])
  staged = [p for p in weir_server.staging_root.rglob('*') if p.is_file() and p.read_bytes() == data]
  assert len(staged) == 1, staged
  with grpc.insecure_channel(weir_server.endpoint) as channel:
    beam_job_api_pb2_grpc.JobServiceStub(channel).Cancel(
        beam_job_api_pb2.CancelJobRequest(job_id=job.preparation_id), timeout=10)
  assert state(weir_server, job.preparation_id) == CANCELLED
  assert not staged[0].exists()
  e = run(weir_server, job.preparation_id)
  assert e.details() == 'job %s was cancelled before it was run' % job.preparation_id, e.details()
