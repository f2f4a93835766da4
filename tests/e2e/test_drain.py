"""Draining a running streaming job (`weir jobs drain`, the Job API's
DrainJob): its unbounded source stops, the windows it opened fire, and the
job ends DRAINED long before its source would have ended."""

import os
import subprocess
import sys
import time

from conftest import weir_jobs

HERE = os.path.dirname(os.path.abspath(__file__))


def states(server):
  rows = [l.split('\t') for l in weir_jobs(server, 'list').splitlines()[1:]]
  return {r[0]: r[1] for r in rows}


def start_job(server, output, *extra):
  """Starts pipelines_drain.py; returns the client process and the job id
  once the job runs and has written two lines."""
  before = set(states(server))
  client = subprocess.Popen(
      [sys.executable, os.path.join(HERE, 'pipelines_drain.py'), str(output),
       '--runner=PortableRunner', '--job_endpoint=' + server.endpoint,
       '--environment_type=LOOPBACK'] + list(extra),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  deadline = time.time() + 90
  while time.time() < deadline:
    now = states(server)
    new = [j for j in now if j not in before]
    if new and now[new[0]] == 'RUNNING' and output.exists() and output.read_text().count('\n') >= 2:
      return client, new[0]
    time.sleep(0.5)
  client.kill()
  raise AssertionError('the streaming job never wrote two lines; log:\n%s' % server.log_tail())


def test_drain_ends_a_streaming_job_with_its_windows_fired(weir_server, tmp_path):
  output = tmp_path / 'counts.txt'
  client, job = start_job(weir_server, output)
  try:
    started_drain = time.time()
    assert weir_jobs(weir_server, 'drain', job).split() == [job, 'DRAINING']
    out, _ = client.communicate(timeout=60)
    assert time.time() - started_drain < 30, 'drain took too long'
    assert 'DRAINED' in out, out
    assert states(weir_server)[job] == 'DRAINED'
    # Every window that fired holds at most two impulses (0.5 s apart in 1 s
    # windows), and none fired twice.
    lines = output.read_text().split()
    starts, counts = lines[0::2], [int(c) for c in lines[1::2]]
    assert len(starts) >= 2 and len(set(starts)) == len(starts), lines
    assert all(1 <= c <= 2 for c in counts), lines
    # Draining a job that already ended leaves it DRAINED.
    assert weir_jobs(weir_server, 'drain', job).split() == [job, 'DRAINED']
  finally:
    if client.poll() is None:
      client.kill()
  assert weir_server.alive(), weir_server.log_tail()


def test_drain_truncates_running_restrictions_with_the_dofns_truncate(weir_server, tmp_path):
  """The unbounded Counter SDF checkpoints every position; drained, its
  running restriction goes through its own `truncate_restriction` (three
  more positions), which then run to the end: the job ends DRAINED."""
  output = tmp_path / 'positions.txt'
  client, job = start_job(weir_server, output, '--counter')
  try:
    assert weir_jobs(weir_server, 'drain', job).split() == [job, 'DRAINING']
    out, _ = client.communicate(timeout=60)
    assert 'DRAINED' in out, out
    assert states(weir_server)[job] == 'DRAINED'
    lines = [l.split() for l in output.read_text().splitlines()]
    positions = [int(p) for p, _ in lines]
    tags = [t for _, t in lines]
    # Positions 0, 1, 2, ... each once; the last three from the truncated
    # restriction.
    assert positions == list(range(len(lines))), lines
    assert len(lines) >= 5, lines
    assert tags == ['before'] * (len(lines) - 3) + ['after'] * 3, lines
  finally:
    if client.poll() is None:
      client.kill()
  assert weir_server.alive(), weir_server.log_tail()


def test_drain_is_refused_for_a_batch_job_which_keeps_running(weir_server, tmp_path):
  """Dataflow refuses to drain a batch job, and Beam's SDKs report a DRAINED
  job as failed: the drain is refused, naming why, and the job runs on."""
  before = set(states(weir_server))
  client = subprocess.Popen(
      [sys.executable, os.path.join(HERE, 'pipelines.py'), 'slow', '--output', str(tmp_path / 'out'),
       '--runner=PortableRunner', '--job_endpoint=' + weir_server.endpoint,
       '--environment_type=LOOPBACK'],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    deadline = time.time() + 90
    job = None
    while time.time() < deadline and job is None:
      now = states(weir_server)
      job = next((j for j in now if j not in before and now[j] == 'RUNNING'), None)
      time.sleep(0.2)
    assert job, weir_server.log_tail()
    from conftest import WEIR_BIN
    drain = subprocess.run([str(WEIR_BIN), 'jobs', '--endpoint', weir_server.endpoint, 'drain', job],
                           capture_output=True, text=True, timeout=60)
    assert drain.returncode != 0, drain.stdout
    assert 'job %s is a batch job: only a streaming job' % job in drain.stderr, drain.stderr
    time.sleep(1)
    assert states(weir_server)[job] == 'RUNNING', states(weir_server)
    assert weir_jobs(weir_server, 'cancel', job).split()[0] == job
    client.communicate(timeout=60)
    assert states(weir_server)[job] == 'CANCELLED'
  finally:
    if client.poll() is None:
      client.kill()
  assert weir_server.alive(), weir_server.log_tail()
