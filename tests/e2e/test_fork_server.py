"""Python SDK harnesses of `weir boot --python` PROCESS environments are
forked from Weir's Python fork server: each job's harnesses are fresh forks
(their own worker id, folder, output and random state), they end with their
job, and with `--python_fork_server=false` Python starts afresh as before.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import REPO, WEIR_BIN, _wait_for_job_api, start_weir_serve
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
      cpus=sorted(os.sched_getaffinity(0)),
      random=random.random(), numpy=float(numpy.random.random())))

out = sys.argv[1]
p = beam.Pipeline(options=PipelineOptions(sys.argv[2:]))
_ = p | beam.Create([0]) | beam.Map(report) | beam.io.WriteToText(out, shard_name_template='')
p.run().wait_until_finish()
'''


# The CPUs this test (and the server it starts) may run on.
ALL_CPUS = sorted(os.sched_getaffinity(0))


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
    # in Weir's working folder (this test's), under its own worker id.
    assert r['ppid'] == fork_server, r
    assert r['argv0'].endswith('sdk_worker_main.py'), r
    assert not r['main_has_fork_server'], r
    assert r['worker'] and r['cwd'] == os.getcwd(), r
    # A one-core harness runs on a core of its own (--pin_sdk_harnesses).
    assert r['cpus'] == ALL_CPUS if len(ALL_CPUS) < 2 else len(r['cpus']) == 1, r
  assert first['worker'].split('-worker-')[0] != second['worker'].split('-worker-')[0]
  if len(ALL_CPUS) >= 2:
    # Each job's harnesses (one per core) went to different cores.
    for r in (first, second):
      job = r['worker'].split('-worker-')[0]
      cpus = re.findall(r'runs on CPU (\d+) \S+ worker=%s-worker-' % re.escape(job),
                        server.log_path.read_text(errors='replace'))
      assert len(cpus) == len(ALL_CPUS) == len(set(cpus)), (job, cpus)
      assert str(r['cpus'][0]) in cpus, (r, cpus)
  # Not the fork server's random state: each fork draws its own numbers.
  assert first['random'] != second['random'] and first['numpy'] != second['numpy']
  # The harness's output reached the runner (its stderr is weir boot's).
  log = server.log_path.read_text(errors='replace')
  assert log.count('FORKTEST harness log line 0') == 2, log[-3000:]
  assert 'Logging client failed' not in log and 'no Python fork server took this harness' not in log
  # The job's end ended its harnesses.
  assert wait_gone([first['pid'], second['pid']]) == []

  server.proc.terminate()
  assert server.proc.wait(timeout=30) == 0
  assert wait_gone([fork_server]) == [], 'the fork server outlived weir serve'


@pytest.mark.parametrize('server', [['--python_fork_server=false']], indirect=True)
def test_without_the_fork_server_python_starts_afresh(server, tmp_path):
  r = run_job(server, tmp_path, 'out.txt')
  # `weir boot` exec'd Python: the harness is the server's own child, in
  # the server's working folder.
  assert r['ppid'] == server.proc.pid, r
  assert r['cwd'] == os.getcwd(), r
  assert not [p for p in descendants(server.proc.pid) if 'fork_server.py' in cmdline(p)]
  # Pinned before the exec: the harness inherits its boot program's core.
  assert r['cpus'] == ALL_CPUS if len(ALL_CPUS) < 2 else len(r['cpus']) == 1, r


@pytest.mark.parametrize('server', [['--pin_sdk_harnesses=false']], indirect=True)
def test_unpinned_harnesses_run_on_every_core_of_the_server(server, tmp_path):
  r = run_job(server, tmp_path, 'out.txt')
  assert r['cpus'] == ALL_CPUS, r


@pytest.mark.parametrize('server', [['--python_fork_server_prewarm', sys.executable]],
                         indirect=True)
def test_a_prewarmed_fork_server_is_up_before_the_first_job_and_forks_its_harnesses(server, tmp_path):
  deadline = time.time() + 30
  before = []
  while not before and time.time() < deadline:
    before = [p for p in descendants(server.proc.pid) if 'fork_server.py' in cmdline(p)]
    time.sleep(0.1)
  assert len(before) == 1, [cmdline(p) for p in descendants(server.proc.pid)]
  r = run_job(server, tmp_path, 'out.txt')
  # The job's harness is a fork of the one started with the server: no other.
  assert r['ppid'] == before[0], r
  assert [p for p in descendants(server.proc.pid) if 'fork_server.py' in cmdline(p)
          and p != r['pid']] == before


# The fork server's protocol, driven directly with a small module in place
# of Beam's harness: what `weir boot` relies on.
FORK_SERVER = REPO / 'crates' / 'harness' / 'src' / 'fork_server.py'
MODULE = r"""
import os, sys, time
print('RAN', os.environ.get('GREETING'), os.getcwd(), sys.argv[1:], __name__, flush=True)
mode = os.environ.get('MODE')
if mode == 'exit':
  sys.exit(int(os.environ['CODE']))
if mode == 'raise':
  raise RuntimeError('boom in the harness')
if mode == 'sleep':
  time.sleep(600)
"""


@pytest.fixture
def fork_server(tmp_path):
  mods = tmp_path / 'mods'
  mods.mkdir()
  (mods / 'forktest_main.py').write_text(MODULE)
  sock = tmp_path / 'fs.sock'
  log = open(tmp_path / 'fork_server.log', 'wb')
  proc = subprocess.Popen(
      [sys.executable, str(FORK_SERVER), str(sock), 'forktest_main'],
      stdin=subprocess.PIPE, stdout=log, stderr=log,
      env=dict(PATH=os.environ['PATH'], PYTHONPATH=str(mods)))
  deadline = time.time() + 30
  while not sock.exists():
    assert proc.poll() is None and time.time() < deadline, (tmp_path / 'fork_server.log').read_text()
    time.sleep(0.02)
  yield proc, sock, tmp_path
  if proc.poll() is None:
    proc.stdin.close()
    proc.wait(timeout=10)


def ask(sock, out, env, cwd, fds=True):
  """Sends one request as `weir boot` does; returns the connection and its replies."""
  s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  s.connect(str(sock))
  line = json.dumps(dict(argv=['a', 'b'], env=env, cwd=str(cwd))).encode() + b'\n'
  null = os.open(os.devnull, os.O_RDONLY)
  try:
    if fds:
      socket.send_fds(s, [line], [null, out.fileno(), out.fileno()])
    else:
      s.sendall(line)
  finally:
    os.close(null)
  return s, s.makefile('rb')


def test_fork_server_runs_the_module_with_the_callers_streams_env_and_folder(fork_server):
  _, sock, tmp = fork_server
  with open(tmp / 'out.txt', 'wb') as out:
    s, replies = ask(sock, out, dict(GREETING='hello', MODE='exit', CODE='7'), tmp)
    assert replies.readline().startswith(b'pid ')
    assert replies.readline() == b'exit 7\n'
    s.close()
  assert (tmp / 'out.txt').read_text() == "RAN hello %s ['a', 'b'] __main__\n" % tmp

  with open(tmp / 'raised.txt', 'wb') as out:
    s, replies = ask(sock, out, dict(MODE='raise'), tmp)
    replies.readline()
    assert replies.readline() == b'exit 1\n'
    s.close()
  assert 'RuntimeError: boom in the harness' in (tmp / 'raised.txt').read_text()


def test_fork_server_kills_a_harness_whose_caller_went_away_and_serves_on(fork_server):
  proc, sock, tmp = fork_server
  with open(tmp / 'out.txt', 'wb') as out:
    # A request without its descriptors is refused, not fatal.
    s, replies = ask(sock, out, {}, tmp, fds=False)
    assert replies.readline().startswith(b'error ')
    s.close()
    # A caller that connects and leaves at once.
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect(str(sock))
    # A harness killed by a signal: its caller reads the signal.
    s, replies = ask(sock, out, dict(MODE='sleep'), tmp)
    pid = int(replies.readline().split()[1])
    os.kill(pid, signal.SIGKILL)
    assert replies.readline() == b'exit -9\n'
    s.close()
    # A harness whose caller goes away (weir boot killed) is killed.
    s, replies = ask(sock, out, dict(MODE='sleep'), tmp)
    pid = int(replies.readline().split()[1])
    replies.close()
    s.close()
    assert wait_gone([pid]) == []
    # Still serving, and its end (Weir gone) ends its harnesses.
    s, replies = ask(sock, out, dict(MODE='sleep'), tmp)
    pid = int(replies.readline().split()[1])
    proc.stdin.close()
    assert proc.wait(timeout=10) is not None
    assert wait_gone([pid]) == []
    s.close()


def test_fork_server_refuses_once_its_code_changed_on_disk_and_exits_after_its_harnesses(fork_server):
  proc, sock, tmp = fork_server
  with open(tmp / 'out.txt', 'wb') as out:
    s, replies = ask(sock, out, dict(MODE='sleep'), tmp)
    pid = int(replies.readline().split()[1])
    # An upgrade rewrites the harness's module.
    module = tmp / 'mods' / 'forktest_main.py'
    module.write_text(MODULE + '\n# upgraded\n')
    s2, replies2 = ask(sock, out, dict(MODE='exit', CODE='0'), tmp)
    assert b'changed on disk' in replies2.readline()
    replies2.close()
    s2.close()
    # The running harness is untouched; its end ends the fork server (75:
    # the Weir server starts a new one).
    assert proc.poll() is None and wait_gone([pid], timeout=0.5) == [pid]
    os.kill(pid, signal.SIGKILL)
    assert replies.readline() == b'exit -9\n'
    assert proc.wait(timeout=10) == 75
    replies.close()
    s.close()
