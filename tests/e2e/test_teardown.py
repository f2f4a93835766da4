"""When a job's SDK harnesses stop, against when the client sees its
terminal state: a job that succeeded is DONE first (its harnesses stop
after), a job that failed stops its harnesses first (their DoFns' teardown
and other bundles' grace come before FAILED). Read from the order of the
server's log lines for the job."""

import json
import re
import sys
from pathlib import Path

from conftest import WEIR_BIN

HERE = Path(__file__).resolve().parent
PIPELINES_PY = HERE / 'pipelines.py'


def _process_flags(server):
  return ['--runner=PortableRunner', '--job_endpoint=%s' % server.endpoint,
          '--environment_type=PROCESS',
          '--environment_config=' + json.dumps(
              {'command': '%s boot --python %s' % (WEIR_BIN, sys.executable)})]


def _run(beam, server, tmp_path, name):
  """Runs pipelines.py NAME under PROCESS; returns the run and the server's
  log lines written meanwhile."""
  with open(server.log_path, 'rb') as f:
    start = len(f.read())
  out = tmp_path / name
  err = tmp_path / (name + '-err.txt')
  run = beam.run([PIPELINES_PY, name, '--output', out, '--error_file', err] +
                 _process_flags(server), out, name, error_file=err)
  with open(server.log_path, 'rb') as f:
    lines = f.read()[start:].decode('utf-8', 'replace').splitlines()
  return run, lines


def _order(lines):
  """(index of the job's terminal state line, its state, index of the first
  'control stream closed' line of one of its SDK harnesses)."""
  terminal = None
  for i, line in enumerate(lines):
    m = re.search(r'job state job=(\S+) state="(DONE|FAILED|CANCELLED)"', line)
    if m:
      terminal = (i, m.group(1), m.group(2))
  assert terminal, 'no terminal state in the log:\n' + '\n'.join(lines[-40:])
  index, job, state = terminal
  closed = [i for i, line in enumerate(lines)
            if re.search(r'SDK harness control stream closed worker=%s-worker-' % re.escape(job),
                         line)]
  assert closed, 'no SDK harness of %s closed its control stream:\n%s' % (
      job, '\n'.join(lines[-40:]))
  return index, state, closed[0]


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
