"""Security: Fn API isolation between jobs, the Job API token, the policy for
non-loopback binds, and the allowlist of PROCESS commands and DOCKER images
(README, "Security model")."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from conftest import REPO, WEIR_BIN, read_output, _wait_for_job_api, start_weir_serve, serving

HERE = Path(__file__).resolve().parent
SECURITY_PY = HERE / 'pipelines_security.py'
PIPELINES_PY = HERE / 'pipelines.py'


def _pb():
  from apache_beam.portability.api import beam_fn_api_pb2
  from apache_beam.portability.api import beam_fn_api_pb2_grpc
  from apache_beam.portability.api import beam_job_api_pb2
  from apache_beam.portability.api import beam_job_api_pb2_grpc
  from apache_beam.portability.api import beam_provision_api_pb2
  from apache_beam.portability.api import beam_provision_api_pb2_grpc
  from apache_beam.portability.api import beam_artifact_api_pb2
  from apache_beam.portability.api import beam_artifact_api_pb2_grpc
  return locals()


def _worker_processes():
  """(pid, worker id) of every running SDK harness process Weir started:
  `weir boot --id=ID`, or the harness it runs (WORKER_ID in its environment)."""
  found = []
  for pid in os.listdir('/proc'):
    if not pid.isdigit():
      continue
    try:
      with open('/proc/%s/cmdline' % pid, 'rb') as f:
        argv = f.read().decode('utf-8', 'replace').split('\0')
      with open('/proc/%s/environ' % pid, 'rb') as f:
        environ = f.read().decode('utf-8', 'replace').split('\0')
    except OSError:
      continue
    for a in argv + environ:
      for prefix in ('--id=', 'WORKER_ID='):
        if a.startswith(prefix):
          found.append((int(pid), a[len(prefix):]))
  return found


def _job_state(stub, pb, job_id):
  return pb['beam_job_api_pb2'].JobState.Enum.Name(
      stub.GetState(pb['beam_job_api_pb2'].GetJobStateRequest(job_id=job_id)).state)


def test_another_client_cannot_reach_a_running_jobs_workers(weir_server, tmp_path):
  """While a PROCESS job runs, a second client that knows the job id (any Job
  API client can list it) and even reads the worker id off a connected
  harness's command line reads none of its state, descriptors or provision
  info and cannot take over that worker; the job still ends DONE with all
  its output. (A harness not yet connected can be claimed first: see the
  README's security limits.)"""
  pb = _pb()
  out = tmp_path / 'out'
  env = dict(os.environ)
  job = subprocess.Popen(
      [sys.executable, SECURITY_PY, 'isolated', '--output', out,
       '--runner=PortableRunner', '--job_endpoint=%s' % weir_server.endpoint,
       '--environment_type=PROCESS',
       '--environment_config=' + json.dumps(
           {'command': '%s boot --python %s' % (WEIR_BIN, sys.executable)})],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
  try:
    channel = grpc.insecure_channel(weir_server.endpoint)
    jobs = pb['beam_job_api_pb2_grpc'].JobServiceStub(channel)
    # Wait until the job runs (one SDK harness has connected; the others
    # may still be starting).
    deadline = time.time() + 120
    job_id = None
    while time.time() < deadline:
      running = [j for j in jobs.GetJobs(pb['beam_job_api_pb2'].GetJobsRequest()).job_info
                 if j.job_name and j.state == pb['beam_job_api_pb2'].JobState.RUNNING]
      ours = [w for _, w in _worker_processes()]
      for j in running:
        if any(w.startswith(j.job_id + '-worker-') for w in ours):
          job_id = j.job_id
      if job_id:
        break
      assert job.poll() is None, job.communicate()
      time.sleep(0.2)
    assert job_id, 'the job did not start running\n' + weir_server.log_tail()
    # A live worker: its harness holds its control connection (the server
    # log says so). A harness still starting has not claimed its id yet, and
    # the Fn API cannot tell the first connection under an id from the
    # harness's own: Beam's boot contract puts the id on the command line.
    worker_id = None
    while worker_id is None and time.time() < deadline:
      with open(weir_server.log_path, encoding='utf-8', errors='replace') as f:
        connected = set(re.findall(r'SDK harness connected \(control\) worker=(\S+)', f.read()))
      live = [w for _, w in _worker_processes()
              if w.startswith(job_id + '-worker-') and w in connected]
      worker_id = live[0] if live else None
      time.sleep(0.1)
    assert worker_id, 'no connected SDK harness of the job\n' + weir_server.log_tail()
    # Worker ids can't be guessed: a readable prefix, a counter, 128 random bits.
    suffix = worker_id[len(job_id + '-worker-'):]
    assert len(suffix.split('-')[1]) == 32, worker_id

    def md(worker):
      return [('worker_id', worker)] if worker else []

    provision = pb['beam_provision_api_pb2_grpc'].ProvisionServiceStub(channel)
    control = pb['beam_fn_api_pb2_grpc'].BeamFnControlStub(channel)
    state = pb['beam_fn_api_pb2_grpc'].BeamFnStateStub(channel)
    retrieval = pb['beam_artifact_api_pb2_grpc'].ArtifactRetrievalServiceStub(channel)

    # Guessed worker ids (the old `<job>-worker-N` form) get nothing.
    for guess in (job_id + '-worker-1', job_id + '-worker-0', None):
      with pytest.raises(grpc.RpcError) as e:
        provision.GetProvisionInfo(
            pb['beam_provision_api_pb2'].GetProvisionInfoRequest(), metadata=md(guess),
            timeout=10)
      assert e.value.code() in (grpc.StatusCode.NOT_FOUND,
                                grpc.StatusCode.INVALID_ARGUMENT), e.value
      with pytest.raises(grpc.RpcError) as e:
        control.GetProcessBundleDescriptor(
            pb['beam_fn_api_pb2'].GetProcessBundleDescriptorRequest(
                process_bundle_descriptor_id=job_id + '/stage-0'),
            metadata=md(guess), timeout=10)
      assert e.value.code() in (grpc.StatusCode.NOT_FOUND,
                                grpc.StatusCode.INVALID_ARGUMENT), e.value
      with pytest.raises(grpc.RpcError) as e:
        list(retrieval.GetArtifact(
            pb['beam_artifact_api_pb2'].GetArtifactRequest(), metadata=md(guess), timeout=10))
      assert e.value.code() in (grpc.StatusCode.NOT_FOUND,
                                grpc.StatusCode.INVALID_ARGUMENT), e.value

    # A state stream without a worker id is refused; one under the real
    # worker's id answers nothing for guessed instruction ids.
    key = pb['beam_fn_api_pb2'].StateKey(
        iterable_side_input=pb['beam_fn_api_pb2'].StateKey.IterableSideInput(
            transform_id='Use', side_input_id='side0'))
    asks = [pb['beam_fn_api_pb2'].StateRequest(
        id=str(n), instruction_id='%s-bundle-%d' % (job_id, n), state_key=key,
        get=pb['beam_fn_api_pb2'].StateGetRequest()) for n in range(1, 6)]
    with pytest.raises(grpc.RpcError) as e:
      list(state.State(iter(asks), timeout=10))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
    answers = state.State(iter(asks), metadata=md(worker_id), timeout=30)
    for answer, _ in zip(answers, asks):
      assert answer.WhichOneof('response') is None, answer
      assert 'not a bundle in flight on SDK worker' in answer.error, answer.error

    # The live worker's id can't be claimed by a second control connection.
    with pytest.raises(grpc.RpcError) as e:
      next(iter(control.Control(iter([]), metadata=md(worker_id), timeout=10)))
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS, e.value
    channel.close()

    stdout, stderr = job.communicate(timeout=300)
  finally:
    if job.poll() is None:
      job.kill()
  assert job.returncode == 0, stdout[-3000:] + stderr[-6000:] + weir_server.log_tail()
  _, lines = read_output(out)
  assert sum(lines.values()) == 2000, len(lines)
  assert lines['1999 secret-side-input'] == 1
  assert weir_server.alive()


def test_a_process_command_outside_the_allowlist_is_refused_at_prepare(beam, weir_server, tmp_path):
  """Only Weir's own `weir boot` (and the operator's patterns) may run."""
  out = tmp_path / 'out'
  run = beam.run(
      [PIPELINES_PY, 'good', '--output', out, '--error_file', tmp_path / 'err.txt',
       '--runner=PortableRunner', '--job_endpoint=%s' % weir_server.endpoint,
       '--environment_type=PROCESS',
       '--environment_config=' + json.dumps({'command': '/bin/sh -c "touch /tmp/pwned"'})],
      out, 'evil-command', error_file=tmp_path / 'err.txt')
  assert run.returncode != 0, run.describe(weir_server)
  text = (run.client_error() or '') + run.stderr
  assert 'PERMISSION_DENIED' in text, run.describe(weir_server)
  assert 'PROCESS command \'/bin/sh -c "touch /tmp/pwned"\' is not allowed' in text.replace(
      '\\"', '"').replace('"/bin/sh -c', '\'/bin/sh -c').replace('pwned""', 'pwned"\''), text[-3000:]


def test_a_docker_image_outside_the_allowlist_is_refused_at_prepare(beam, weir_server, tmp_path):
  out = tmp_path / 'out'
  run = beam.run(
      [PIPELINES_PY, 'good', '--output', out, '--error_file', tmp_path / 'err.txt',
       '--runner=PortableRunner', '--job_endpoint=%s' % weir_server.endpoint,
       '--environment_type=DOCKER', '--environment_config=alpine:3'],
      out, 'evil-image', error_file=tmp_path / 'err.txt')
  assert run.returncode != 0, run.describe(weir_server)
  text = (run.client_error() or '') + run.stderr
  assert 'PERMISSION_DENIED' in text, run.describe(weir_server)
  assert 'DOCKER image \\"alpine:3\\" is not allowed' in text or \
      'DOCKER image "alpine:3" is not allowed' in text, \
      run.describe(weir_server)


def _start(tmp_path, *flags):
  return start_weir_serve(tmp_path / ('weir-%d.log' % time.time_ns()), flags)


def test_a_remote_bind_without_a_policy_refuses_to_start(tmp_path):
  server = _start(tmp_path, '--bind', '0.0.0.0')
  assert server.proc.wait(timeout=30) != 0
  log = server.log_path.read_text()
  assert 'refusing to serve on 0.0.0.0' in log, log
  assert '--auth_token' in log and '--insecure_allow_remote' in log, log
  # An explicit choice starts it.
  server = _start(tmp_path, '--bind', '0.0.0.0', '--insecure_allow_remote')
  try:
    _wait_for_job_api(server)
  finally:
    server.proc.terminate()
    server.proc.wait(timeout=10)


@pytest.fixture(scope='module')
def token_server(tmp_path_factory):
  tmp = tmp_path_factory.mktemp('token')
  token_file = tmp / 'token'
  token_file.write_text('weir-e2e-token-%d\n' % os.getpid())
  server = _start(tmp, '--bind', '0.0.0.0', '--auth_token_file', str(token_file))
  server.token = token_file.read_text().strip()
  with serving(server):
    yield server


def test_every_job_api_call_needs_the_token(token_server):
  pb = _pb()
  j = pb['beam_job_api_pb2']
  a = pb['beam_artifact_api_pb2']
  channel = grpc.insecure_channel(token_server.endpoint)
  jobs = pb['beam_job_api_pb2_grpc'].JobServiceStub(channel)
  staging = pb['beam_artifact_api_pb2_grpc'].ArtifactStagingServiceStub(channel)
  calls = {
      'Prepare': lambda md: jobs.Prepare(j.PrepareJobRequest(), metadata=md, timeout=10),
      'Run': lambda md: jobs.Run(j.RunJobRequest(preparation_id='x'), metadata=md, timeout=10),
      'GetJobs': lambda md: jobs.GetJobs(j.GetJobsRequest(), metadata=md, timeout=10),
      'GetState': lambda md: jobs.GetState(j.GetJobStateRequest(job_id='x'), metadata=md, timeout=10),
      'GetPipeline': lambda md: jobs.GetPipeline(j.GetJobPipelineRequest(job_id='x'), metadata=md, timeout=10),
      'Cancel': lambda md: jobs.Cancel(j.CancelJobRequest(job_id='x'), metadata=md, timeout=10),
      'Drain': lambda md: jobs.Drain(j.DrainJobRequest(job_id='x'), metadata=md, timeout=10),
      'GetStateStream': lambda md: list(jobs.GetStateStream(j.GetJobStateRequest(job_id='x'), metadata=md, timeout=10)),
      'GetMessageStream': lambda md: list(jobs.GetMessageStream(j.JobMessagesRequest(job_id='x'), metadata=md, timeout=10)),
      'GetJobMetrics': lambda md: jobs.GetJobMetrics(j.GetJobMetricsRequest(job_id='x'), metadata=md, timeout=10),
      'DescribePipelineOptions': lambda md: jobs.DescribePipelineOptions(j.DescribePipelineOptionsRequest(), metadata=md, timeout=10),
      'ReverseArtifactRetrievalService': lambda md: list(staging.ReverseArtifactRetrievalService(
          iter([a.ArtifactResponseWrapper(staging_token='x')]), metadata=md, timeout=10)),
  }
  for name, call in calls.items():
    for md in ([], [('authorization', 'Bearer wrong')]):
      with pytest.raises(grpc.RpcError) as e:
        call(md)
      assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, (name, md, e.value)
      assert 'token' in e.value.details(), (name, e.value.details())
  # With the token the calls reach Weir (and fail on the fake ids, if at all).
  good = [('authorization', 'Bearer ' + token_server.token)]
  for name, call in calls.items():
    try:
      call(good)
    except grpc.RpcError as e:
      assert e.code() != grpc.StatusCode.UNAUTHENTICATED, (name, e)
  channel.close()


def test_weirs_clients_send_the_token(token_server, tmp_path):
  cli = [str(WEIR_BIN), 'jobs', '--endpoint', token_server.endpoint, 'list']
  refused = subprocess.run(cli, capture_output=True, text=True, timeout=60,
                           env={k: v for k, v in os.environ.items() if k != 'WEIR_AUTH_TOKEN'})
  assert refused.returncode != 0 and 'token' in refused.stderr, refused.stderr
  listed = subprocess.run(cli + ['--auth_token', token_server.token],
                          capture_output=True, text=True, timeout=60)
  assert listed.returncode == 0, listed.stderr
  assert listed.stdout.startswith('JOB_ID\tSTATE'), listed.stdout

  # A Beam Python pipeline through `python -m weir_auth`.
  out = tmp_path / 'out'
  env = dict(os.environ, WEIR_AUTH_TOKEN=token_server.token,
             PYTHONPATH=os.pathsep.join([str(REPO / 'python'), str(HERE)]))
  args = [PIPELINES_PY, 'good', '--output', out, '--runner=PortableRunner',
          '--job_endpoint=%s' % token_server.endpoint, '--environment_type=LOOPBACK']
  ran = subprocess.run([sys.executable, '-m', 'weir_auth'] + [str(a) for a in args],
                       capture_output=True, text=True, timeout=300, env=env)
  assert ran.returncode == 0, ran.stderr[-5000:] + token_server.log_tail()
  _, lines = read_output(out)
  assert lines == {'x: 4': 1, 'y: 2': 1}, lines
  # Without it the submission is refused.
  env.pop('WEIR_AUTH_TOKEN')
  plain = subprocess.run([sys.executable] + [str(a) for a in args] + ['--job_server_timeout=20'],
                         capture_output=True, text=True, timeout=300, env=env)
  assert plain.returncode != 0
  assert 'UNAUTHENTICATED' in plain.stderr, plain.stderr[-3000:]
