"""`weir serve` stopped by SIGINT or SIGTERM cancels its unfinished jobs,
so their clients see CANCELLED and their SDK harness processes end with it.

Run in the background by a non-interactive shell, a process inherits SIGINT
ignored; Weir installs its own handler, so Ctrl-C semantics hold there too.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import WEIR_BIN, _wait_for_job_api, start_weir_serve

# A job whose bundles sleep far longer than the test: only a cancel ends it.
CLIENT = r'''
import sys, time
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
opts = PipelineOptions(sys.argv[1:])
p = beam.Pipeline(options=opts)
_ = (p | beam.Create(list(range(4))) | beam.Reshuffle()
       | beam.Map(lambda x: time.sleep(600) or x))
result = p.run()
try:
  result.wait_until_finish()
except Exception as e:
  print('client error: %s' % e)
print('final state: %s' % result.state, flush=True)
'''


def descendants(pid):
  """Pids of every process below `pid` (from /proc's parent links)."""
  children = {}
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    try:
      with open('/proc/%s/stat' % entry) as f:
        stat = f.read()
    except OSError:
      continue
    ppid = int(stat.rsplit(')', 1)[1].split()[1])
    children.setdefault(ppid, []).append(int(entry))
  found, todo = [], [pid]
  while todo:
    for child in children.get(todo.pop(), []):
      found.append(child)
      todo.append(child)
  return found


def cmdline(pid):
  try:
    with open('/proc/%d/cmdline' % pid, 'rb') as f:
      return f.read().replace(b'\0', b' ').decode(errors='replace')
  except OSError:
    return ''


def alive(pid):
  try:
    with open('/proc/%d/stat' % pid) as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except OSError:
    return False


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM], ids=['SIGINT', 'SIGTERM'])
def test_signal_cancels_running_jobs_and_stops_their_harnesses(tmp_path, signum):
  server = start_weir_serve(
      tmp_path / 'weir.log',
      ['--bind', '127.0.0.1', '--ui_port', '0', '--staging_dir', tmp_path / 'staging'],
      env=dict(os.environ, NO_COLOR='1'))
  client = None
  try:
    _wait_for_job_api(server)
    script = tmp_path / 'client.py'
    script.write_text(CLIENT)
    client = subprocess.Popen(
        [sys.executable, str(script), '--runner=PortableRunner',
         '--job_endpoint=%s' % server.endpoint, '--environment_type=PROCESS',
         '--environment_config=' + json.dumps(
             {'command': '%s boot --python %s' % (WEIR_BIN, sys.executable)})],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.time() + 120
    harnesses = []
    while not harnesses:
      assert time.time() < deadline, 'no SDK harness started; log:\n' + server.log_tail()
      assert client.poll() is None, client.stdout.read().decode(errors='replace')
      harnesses = [p for p in descendants(server.proc.pid)
                   if 'sdk_worker_main' in cmdline(p)]
      time.sleep(0.2)
    time.sleep(2)  # the sleeping bundles are in flight
    harnesses = descendants(server.proc.pid)

    server.proc.send_signal(signum)
    code = server.proc.wait(timeout=30)
    assert code == 0, server.log_tail()
    log = server.log_path.read_text(errors='replace')
    name = signal.Signals(signum).name
    assert '%s: cancelling 1 unfinished job(s) before stopping' % name in log, log[-3000:]
    out, _ = client.communicate(timeout=60)
    out = out.decode(errors='replace')
    assert 'final state: CANCELLED' in out, out[-3000:]
    deadline = time.time() + 10
    while any(alive(p) for p in harnesses) and time.time() < deadline:
      time.sleep(0.1)
    left = [(p, cmdline(p)) for p in harnesses if alive(p)]
    assert left == [], left
  finally:
    if client and client.poll() is None:
      client.kill()
    if server.proc.poll() is None:
      server.proc.kill()
      server.proc.wait()


def test_signal_with_no_jobs_exits_at_once(tmp_path):
  server = start_weir_serve(
      tmp_path / 'weir.log', ['--bind', '127.0.0.1', '--ui_port', '0'],
      env=dict(os.environ, NO_COLOR='1'))
  try:
    _wait_for_job_api(server)
    began = time.time()
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(timeout=10) == 0, server.log_tail()
    assert time.time() - began < 3, time.time() - began
    assert 'SIGINT: stopping' in server.log_path.read_text(errors='replace')
  finally:
    if server.proc.poll() is None:
      server.proc.kill()
      server.proc.wait()
