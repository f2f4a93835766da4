"""Fast, clear failures: a bundle that fails before its data arrives, Cancel
while SDK harnesses start, a LOOPBACK job whose client (its worker pool) is
gone, and a pipeline option too large for an environment variable."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import WEIR_BIN, read_output

HERE = Path(__file__).resolve().parent
SECURITY_PY = HERE / 'pipelines_security.py'
PIPELINES_PY = HERE / 'pipelines.py'


def _portable(server, mode='LOOPBACK'):
  flags = ['--runner=PortableRunner', '--job_endpoint=%s' % server.endpoint,
           '--environment_type=%s' % mode]
  if mode == 'PROCESS':
    flags.append('--environment_config=' + json.dumps(
        {'command': '%s boot --python %s' % (WEIR_BIN, sys.executable)}))
  return flags


def test_a_bundle_failing_before_its_data_fails_at_once_with_the_sdks_error(
    beam, weir_server, tmp_path):
  out = tmp_path / 'out'
  began = time.monotonic()
  run = beam.run([SECURITY_PY, 'setup_boom', '--output', out,
                  '--error_file', tmp_path / 'err.txt'] + _portable(weir_server),
                 out, 'setup-boom', error_file=tmp_path / 'err.txt')
  took = time.monotonic() - began
  assert run.returncode != 0, run.describe(weir_server)
  # Four attempts, none waiting for a data stream that never opens (120 s each before).
  assert took < 60, 'took %.0fs\n%s' % (took, run.describe(weir_server))
  text = (run.client_error() or '') + run.stderr
  assert 'weir-setup-boom' in text, run.describe(weir_server)
  assert 'bundle failed 4 times' in text, run.describe(weir_server)


def test_cancel_while_sdk_harnesses_start_ends_cancelled_at_once(weir_server, tmp_path):
  boot = tmp_path / 'slow-boot.sh'
  boot.write_text('#!/bin/sh\nsleep 120\n')
  boot.chmod(0o755)
  out = tmp_path / 'out'
  began = time.monotonic()
  run = subprocess.run(
      [sys.executable, PIPELINES_PY, 'good', '--output', out, '--cancel_after', '3',
       '--runner=PortableRunner', '--job_endpoint=%s' % weir_server.endpoint,
       '--environment_type=PROCESS',
       '--environment_config=' + json.dumps({'command': str(boot)})],
      capture_output=True, text=True, timeout=120)
  took = time.monotonic() - began
  # wait_until_finish returns CANCELLED, or (Beam 2.77) raises naming it.
  text = run.stdout + run.stderr
  assert ('PIPELINE STATE: CANCELLED' in text or
          'failed in state CANCELLED' in text), text[-3000:]
  # Submission (a few seconds), 3 s, then at most 5 s to CANCELLED.
  assert took < 30, 'took %.0fs\n%s' % (took, run.stderr[-3000:])
  assert weir_server.alive()


def test_a_loopback_job_whose_client_is_gone_fails_naming_its_worker_pool(weir_server, tmp_path):
  import grpc
  from apache_beam.portability.api import beam_job_api_pb2
  from apache_beam.portability.api import beam_job_api_pb2_grpc
  out = tmp_path / 'out'
  client = subprocess.Popen(
      [sys.executable, PIPELINES_PY, 'slow', '--output', out] + _portable(weir_server),
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  channel = grpc.insecure_channel(weir_server.endpoint)
  jobs = beam_job_api_pb2_grpc.JobServiceStub(channel)
  known = {j.job_id for j in jobs.GetJobs(beam_job_api_pb2.GetJobsRequest()).job_info
           if j.state != beam_job_api_pb2.JobState.RUNNING}
  job_id = None
  deadline = time.time() + 120
  while time.time() < deadline and not job_id:
    for j in jobs.GetJobs(beam_job_api_pb2.GetJobsRequest()).job_info:
      if j.state == beam_job_api_pb2.JobState.RUNNING and j.job_id not in known:
        job_id = j.job_id
    time.sleep(0.2)
  assert job_id, weir_server.log_tail()
  time.sleep(2)  # a bundle is in the (sleeping) SDK harness
  client.send_signal(signal.SIGKILL)
  client.wait()
  killed = time.monotonic()
  state = None
  while time.monotonic() - killed < 60:
    state = jobs.GetState(beam_job_api_pb2.GetJobStateRequest(job_id=job_id)).state
    if state in (beam_job_api_pb2.JobState.FAILED, beam_job_api_pb2.JobState.DONE,
                 beam_job_api_pb2.JobState.CANCELLED):
      break
    time.sleep(0.5)
  assert state == beam_job_api_pb2.JobState.FAILED, (
      beam_job_api_pb2.JobState.Enum.Name(state), weir_server.log_tail())
  logs = subprocess.run([str(WEIR_BIN), 'jobs', '--endpoint', weir_server.endpoint, 'logs', job_id],
                        capture_output=True, text=True, timeout=60).stdout
  assert 'worker pool of environment' in logs and 'is gone' in logs, logs[-3000:]
  channel.close()


def test_a_200kb_option_reaches_a_process_harness(beam, weir_server, tmp_path):
  """Options go to `weir boot`'s harness in a file: a 200 KB option used to
  fail exec ("Argument list too long") in an environment variable."""
  out = tmp_path / 'out'
  # Added inside the client: 200 KB is too long for its own command line too.
  add_big = ('import sys; sys.path.insert(0, %r); import pipelines; '
             'sys.exit(pipelines.main(sys.argv[1:] + '
             '["--experiments=weir_test_big=" + "x" * 200000]))' % str(HERE))
  run = beam.run(['-c', add_big, 'good', '--output', out] +
                 _portable(weir_server, 'PROCESS'), out, 'big-option')
  assert run.returncode == 0, run.describe(weir_server)
  _, lines = read_output(out)
  assert lines == {'x: 4': 1, 'y: 2': 1}, lines
