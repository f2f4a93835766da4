"""When a job's SDK harnesses stop, against when the client sees its
terminal state: a job that succeeded is DONE first (its harnesses stop
after), a job that failed stops its harnesses first (their DoFns' teardown
and other bundles' grace come before FAILED). Read from the order of the
server's log lines for the job. Under LOOPBACK the harnesses are threads
of the client: they have finished before it sees DONE."""

import json
import re
import sys
import time
from pathlib import Path

from conftest import WEIR_BIN, king_lear_path

HERE = Path(__file__).resolve().parent
PIPELINES_PY = HERE / 'pipelines.py'


def _process_flags(server):
  return ['--runner=PortableRunner', '--job_endpoint=%s' % server.endpoint,
          '--environment_type=PROCESS',
          '--environment_config=' + json.dumps(
              {'command': '%s boot --python %s' % (WEIR_BIN, sys.executable)})]


def _run(beam, server, tmp_path, name):
  """Runs pipelines.py NAME under PROCESS; returns the run and the server's
  log lines written since it was submitted, once the job's SDK harnesses
  have stopped (their teardown may follow DONE)."""
  with open(server.log_path, 'rb') as f:
    start = len(f.read())
  out = tmp_path / name
  err = tmp_path / (name + '-err.txt')
  run = beam.run([PIPELINES_PY, name, '--output', out, '--error_file', err] +
                 _process_flags(server), out, name, error_file=err)
  deadline = time.time() + 30
  while True:
    with open(server.log_path, 'rb') as f:
      lines = f.read()[start:].decode('utf-8', 'replace').splitlines()
    job = _job_id(lines)
    if job and _closed(lines, job) or time.time() > deadline:
      return run, lines
    time.sleep(0.1)


def _job_id(lines):
  """The id of the job prepared in `lines` (the server runs one test at a time)."""
  for line in lines:
    m = re.search(r'prepared job=(\S+)', line)
    if m:
      return m.group(1)
  return None


def _closed(lines, job):
  """Indices of the lines where an SDK harness of `job` lost its control
  stream: closed, or broken when the process was killed first."""
  pattern = r'SDK harness control stream (closed|broken).*? worker=%s-worker-' % re.escape(job)
  return [i for i, line in enumerate(lines) if re.search(pattern, line)]


def _order(lines):
  """(index of the job's terminal state line, its state, index of the
  first line where one of its SDK harnesses lost its control stream)."""
  job = _job_id(lines)
  assert job, 'no job prepared in the log:\n' + '\n'.join(lines[-40:])
  terminal = [(i, m.group(1)) for i, line in enumerate(lines)
              for m in [re.search(r'job state job=%s state="(DONE|FAILED|CANCELLED)"' % re.escape(job),
                                  line)] if m]
  assert terminal, 'no terminal state of %s in the log:\n%s' % (job, '\n'.join(lines[-40:]))
  closed = _closed(lines, job)
  assert closed, 'no SDK harness of %s lost its control stream:\n%s' % (
      job, '\n'.join(lines[-40:]))
  return terminal[0][0], terminal[0][1], closed[0]


def test_a_job_that_succeeds_is_done_before_its_sdk_harnesses_stop(beam, weir_server, tmp_path):
  run, lines = _run(beam, weir_server, tmp_path, 'good')
  assert run.returncode == 0, run.describe(weir_server)
  _, lines_out = run.output()
  assert lines_out == {'x: 4': 1, 'y: 2': 1}, run.describe(weir_server)
  terminal, state, closed = _order(lines)
  assert state == 'DONE'
  assert terminal < closed, '\n'.join(lines)


def test_a_job_that_fails_stops_its_sdk_harnesses_before_it_is_failed(
    beam, weir_server, tmp_path):
  run, lines = _run(beam, weir_server, tmp_path, 'boom')
  assert run.returncode != 0, run.describe(weir_server)
  terminal, state, closed = _order(lines)
  assert state == 'FAILED'
  assert closed < terminal, '\n'.join(lines)


def test_loopback_harnesses_shut_down_before_the_client_sees_done(beam, weir_server):
  """A client that exits on DONE while its harness threads still shut down
  and log can die in Python's interpreter shutdown ("could not acquire lock
  for <stderr> at interpreter shutdown"). Weir reports DONE once every
  harness has ended its control stream and closed its data stream, which
  leaves them only the closing of their state channel and bundle
  processors: what they log up to there comes before the client's DONE."""
  # Beam's wordcount example logs at INFO, the harness threads' lines too.
  run = beam.run_wordcount(king_lear_path(), 'LOOPBACK')
  assert run.returncode == 0, run.describe(weir_server)
  _, counts = run.output()
  assert counts['Lear: 17'] == 1, run.describe(weir_server)
  log = run.stderr.splitlines()
  state = [i for i, l in enumerate(log) if 'Job state changed to DONE' in l]
  assert state, run.describe(weir_server)
  before = log[:state[0]]
  def count(text, lines):
    return sum(text in l for l in lines)
  harnesses = count('Control channel established', log)
  assert harnesses >= 1, run.describe(weir_server)
  assert count('No more requests from control plane', before) == harnesses, run.describe(weir_server)
  data = count('Data channel established', log)
  assert count('Closing all cached grpc data channels', before) >= data, run.describe(weir_server)
