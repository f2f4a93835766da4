"""Python SDK harnesses of `weir boot --python` PROCESS environments are
forked from Weir's Python fork server: each job's harnesses are fresh forks
(their own worker id, folder, output and random state), they end with their
job, and with `--python_fork_server=false` Python starts afresh as before.
"""

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import WEIR_BIN, _wait_for_job_api, start_weir_serve
from test_shutdown import alive, cmdline, descendants

# Each element reports what the harness that processed it sees of itself.
CLIENT = r'''
import json, os, random, sys
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

def report(x):
  import logging, numpy, __main__
  logging.getLogger('forktest').warning('FORKTEST harness log line %d', x)
  return json.dumps(dict(
      element=x, pid=os.getpid(), ppid=os.getppid(),
      worker=os.environ.get('WORKER_ID'), cwd=os.getcwd(),
      argv0=sys.argv[0], main_has_fork_server=hasattr(__main__, 'become_harness'),
      random=random.random(), numpy=float(numpy.random.random())))

out = sys.argv[1]
p = beam.Pipeline(options=PipelineOptions(sys.argv[2:]))
_ = p | beam.Create([0]) | beam.Map(report) | beam.io.WriteToText(out, shard_name_template='')
p.run().wait_until_finish()
'''


def run_job(server, tmp_path, name):
  script = tmp_path / 'client.py'
  script.write_text(CLIENT)
  out = tmp_path / name
  run = subprocess.run(
      [sys.executable, str(script), str(out), '--runner=PortableRunner',
       '--job_endpoint=%s' % server.endpoint, '--environment_type=PROCESS',
       '--environment_config=' + json.dumps(
           {'command': '%s boot --python %s' % (WEIR_BIN, sys.executable)})],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=300)
  assert run.returncode == 0, run.stdout.decode(errors='replace')[-3000:] + server.log_tail()
  return json.loads(out.read_text())


def wait_gone(pids, timeout=15):
  deadline = time.time() + timeout
  while any(alive(p) for p in pids) and time.time() < deadline:
    time.sleep(0.1)
  return [p for p in pids if alive(p)]


@pytest.fixture
def server(tmp_path, request):
  flags = ['--bind', '127.0.0.1', '--ui_port', '0', '--staging_dir', tmp_path / 'staging']
  flags += getattr(request, 'param', [])
  s = start_weir_serve(tmp_path / 'weir.log', flags, env=dict(os.environ, NO_COLOR='1'))
  try:
    _wait_for_job_api(s)
    yield s
  finally:
    if s.alive():
      s.proc.terminate()
      s.proc.wait(timeout=30)


def test_harnesses_are_fresh_forks_of_the_fork_server(server, tmp_path):
  first = run_job(server, tmp_path, 'first.txt')
  second = run_job(server, tmp_path, 'second.txt')

  fork_servers = [p for p in descendants(server.proc.pid) if 'fork_server.py' in cmdline(p)]
  assert len(fork_servers) == 1, [cmdline(p) for p in descendants(server.proc.pid)]
  fork_server = fork_servers[0]
  assert 'apache_beam.runners.worker.sdk_worker_main' in cmdline(fork_server)
  for r in (first, second):
    # Forked by the fork server, as `python -m` would have run the module,
    # in its own worker's folder, under its own worker id.
    assert r['ppid'] == fork_server, r
    assert r['argv0'].endswith('sdk_worker_main.py'), r
    assert not r['main_has_fork_server'], r
    assert r['worker'] and r['worker'] in r['cwd'], r
  assert first['worker'].split('-worker-')[0] != second['worker'].split('-worker-')[0]
  # Not the fork server's random state: each fork draws its own numbers.
  assert first['random'] != second['random'] and first['numpy'] != second['numpy']
  # The harness's output reached the runner (its stderr is weir boot's).
  log = server.log_path.read_text(errors='replace')
  assert log.count('FORKTEST harness log line 0') == 2, log[-3000:]
  assert 'Logging client failed' not in log and 'fork server did not answer' not in log
  # The job's end ended its harnesses.
  assert wait_gone([first['pid'], second['pid']]) == []

  server.proc.terminate()
  assert server.proc.wait(timeout=30) == 0
  assert wait_gone([fork_server]) == [], 'the fork server outlived weir serve'


@pytest.mark.parametrize('server', [['--python_fork_server=false']], indirect=True)
def test_without_the_fork_server_python_starts_afresh(server, tmp_path):
  r = run_job(server, tmp_path, 'out.txt')
  # `weir boot` exec'd Python: the harness is the server's own child.
  assert r['ppid'] == server.proc.pid, r
  assert not [p for p in descendants(server.proc.pid) if 'fork_server.py' in cmdline(p)]
