"""Cluster mode: one job across several `weir worker` processes.

A coordinator (`weir serve --cluster_port`) with three local workers
(`--local_workers 3`, each a `weir worker --coordinator` process) runs
pipelines with `--num_workers=3`; their output must equal DirectRunner's.
GroupByKey and stateful inputs then cross processes (exchanged by key over
timely's TCP transport) and side inputs are broadcast to every process.
Also: a worker killed mid-job (the batch job restarts and ends with exact
output), a worker with the wrong token (refused), and, as root, two
"machines" in their own network namespaces.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, WEIR_BIN, free_port, king_lear_path, read_output

HERE = Path(__file__).resolve().parent
PIPELINES = HERE / 'pipelines_cluster.py'
TIMEOUT = float(os.environ.get('WEIR_E2E_TIMEOUT', '300'))


class Cluster:
  def __init__(self, tmp, workers, extra=()):
    self.tmp = tmp
    self.port = free_port()
    self.cluster_port = free_port()
    self.log_path = tmp / 'coordinator.log'
    env = dict(os.environ, RUST_LOG='info', NO_COLOR='1')
    self.log = open(self.log_path, 'wb')
    self.proc = subprocess.Popen(
        [str(WEIR_BIN), 'serve', '--job_port', str(self.port), '--bind', '127.0.0.1',
         '--cluster_port', str(self.cluster_port), '--local_workers', str(workers),
         '--serve_http=false', '--staging_dir', str(tmp / 'staging')] + list(extra),
        stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    self.wait_for_workers(workers)

  @property
  def endpoint(self):
    return 'localhost:%d' % self.port

  def text(self):
    with open(self.log_path, encoding='utf-8', errors='replace') as f:
      return f.read()

  def registered(self):
    return len(re.findall(r'worker registered', self.text()))

  def wait_for_workers(self, n, timeout=60):
    deadline = time.time() + timeout
    while self.registered() < n:
      assert self.proc.poll() is None, self.text()[-5000:]
      assert time.time() < deadline, 'workers did not register:\n' + self.text()[-5000:]
      time.sleep(0.2)

  def worker_pids(self):
    out = subprocess.run(['pgrep', '-f', 'worker --coordinator 127.0.0.1:%d' % self.cluster_port],
                         capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]

  def stop(self):
    self.proc.terminate()
    try:
      self.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
      self.proc.kill()
      self.proc.wait()
    self.log.close()
    # The workers get SIGTERM when their parent dies (PR_SET_PDEATHSIG).
    deadline = time.time() + 20
    while self.worker_pids() and time.time() < deadline:
      time.sleep(0.2)
    assert not self.worker_pids(), 'local workers outlived their coordinator'


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
  c = Cluster(tmp_path_factory.mktemp('cluster'), 3)
  yield c
  c.stop()


def environment(mode):
  if mode == 'LOOPBACK':
    return ['--environment_type=LOOPBACK']
  return ['--environment_type=PROCESS',
          '--environment_config={"command": "%s boot --python %s"}' % (WEIR_BIN, sys.executable)]


def run(args, cwd, env=None):
  out = subprocess.run([sys.executable] + [str(a) for a in args], cwd=cwd, capture_output=True,
                       text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL, env=env)
  return out


def direct(tmp_path, name, extra=()):
  prefix = tmp_path / ('direct-%s' % name) / 'out'
  out = run([PIPELINES, name, '--output', prefix, '--runner=DirectRunner'] + list(extra), tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  return read_output(prefix)[1]


def on_cluster(cluster, tmp_path, name, mode='LOOPBACK', extra=(), workers=3):
  prefix = tmp_path / ('cluster-%s-%s' % (name, mode.lower())) / 'out'
  out = run([PIPELINES, name, '--output', prefix, '--runner=PortableRunner',
             '--job_endpoint=%s' % cluster.endpoint, '--num_workers=%d' % workers] +
            environment(mode) + list(extra), tmp_path)
  assert out.returncode == 0, out.stderr[-5000:] + '\n--- coordinator\n' + cluster.text()[-5000:]
  return out, read_output(prefix)[1]


@pytest.mark.parametrize('mode', ['LOOPBACK', 'PROCESS'])
def test_wordcount_on_three_workers_equals_direct_runner(cluster, tmp_path, mode):
  lear = king_lear_path()
  outs = {}
  for runner, opts in (('direct', ['--runner=DirectRunner']),
                       ('cluster', ['--runner=PortableRunner', '--job_endpoint=%s' % cluster.endpoint,
                                    '--num_workers=3'] + environment(mode))):
    prefix = tmp_path / runner / 'counts'
    out = run(['-m', 'apache_beam.examples.wordcount', '--input', lear, '--output', prefix] + opts,
              tmp_path)
    assert out.returncode == 0, out.stderr[-5000:] + cluster.text()[-3000:]
    outs[runner] = read_output(prefix)[1]
  assert outs['cluster'] == outs['direct']
  assert len(outs['cluster']) == 4865 and outs['cluster']['the: 786'] == 1


@pytest.mark.parametrize('name', ['keyed', 'stateful', 'side_input'])
def test_keyed_stateful_and_side_input_stages_across_processes(cluster, tmp_path, name):
  out, lines = on_cluster(cluster, tmp_path, name)
  assert lines == direct(tmp_path, name)
  # The coordinator ran it on three workers and relayed their messages.
  assert 'running on 3 worker process(es)' in out.stderr, out.stderr[-3000:]
  if name == 'keyed':
    # A user counter incremented on every worker, summed by the coordinator.
    assert 'COUNTER napped=600' in out.stdout, out.stdout[-2000:]


E2E_PIPELINES = HERE / 'pipelines.py'


@pytest.mark.parametrize('name', ['gbk', 'flatten', 'side_input', 'combine_per_key', 'windowed',
                                  'custom_merging', 'multimap_side_input', 'sdf_split',
                                  'large_elements'])
def test_batch_e2e_pipelines_on_three_workers_equal_direct_runner(cluster, tmp_path, name):
  got = {}
  for runner, opts in (('direct', ['--runner=DirectRunner']),
                       ('cluster', ['--runner=PortableRunner', '--job_endpoint=%s' % cluster.endpoint,
                                    '--num_workers=3'] + environment('LOOPBACK'))):
    prefix = tmp_path / runner / 'out'
    out = run([E2E_PIPELINES, name, '--output', prefix] + opts, tmp_path)
    assert out.returncode == 0, out.stderr[-5000:] + cluster.text()[-3000:]
    got[runner] = read_output(prefix)[1]
  assert got['cluster'] == got['direct']
  assert got['cluster'], 'no output'


STREAMING_PIPELINES = HERE / 'pipelines_streaming.py'


@pytest.mark.parametrize('name', ['default_late', 'watermark_early_processing_time',
                                  'repeatedly_processing_time', 'timers_processing',
                                  'stateful_late'])
def test_test_stream_pipelines_on_the_cluster_give_their_exact_panes(cluster, tmp_path, name):
  """TestStream pipelines (streaming, on the TestStream's processing-time
  clock) asked to run on three workers run on one worker process, say so,
  and give exactly the panes test_streaming.py expects of one process."""
  import collections
  from test_streaming import EXPECTED, STREAMING, diff
  prefix = tmp_path / ('cluster-%s' % name) / 'out'
  prefix.parent.mkdir(parents=True)  # the streaming sink writes files, no folders
  out = run([STREAMING_PIPELINES, name, '--output', prefix, '--runner=PortableRunner',
             '--job_endpoint=%s' % cluster.endpoint, '--num_workers=3'] + STREAMING +
            environment('LOOPBACK'), tmp_path)
  assert out.returncode == 0, out.stderr[-5000:] + '\n--- coordinator\n' + cluster.text()[-5000:]
  expected = collections.Counter(EXPECTED[name])
  lines = read_output(prefix)[1]
  assert lines == expected, diff(expected, lines)
  assert 'beam:transform:teststream:v1): it runs on one worker process, not the 3' in out.stderr, \
      out.stderr[-3000:]


def test_every_worker_takes_part(cluster, tmp_path):
  """Each worker process started SDK harnesses and ran bundles of the job."""
  before = {n: cluster.text().count('[local-%d]' % n) for n in (1, 2, 3)}
  out, lines = on_cluster(cluster, tmp_path, 'keyed', mode='PROCESS')
  assert lines == direct(tmp_path, 'keyed')
  for n in (1, 2, 3):
    assert '[local-%d] starting' % n in out.stderr, out.stderr[-4000:]


def test_a_job_needing_more_workers_than_exist_waits_then_fails(tmp_path):
  c = Cluster(tmp_path, 1, extra=['--worker_wait_secs', '3'])
  try:
    prefix = tmp_path / 'out'
    out = run([PIPELINES, 'keyed', '--output', prefix, '--runner=PortableRunner',
               '--job_endpoint=%s' % c.endpoint, '--num_workers=2'] + environment('LOOPBACK'),
              tmp_path)
    assert out.returncode != 0
    assert 'needs 2 worker process(es) (--num_workers)' in out.stderr, out.stderr[-3000:]
    assert 'has 1 registered' in out.stderr, out.stderr[-3000:]
  finally:
    c.stop()


def test_a_killed_worker_restarts_the_batch_job_with_exact_output(tmp_path):
  c = Cluster(tmp_path, 3)
  try:
    prefix = tmp_path / 'killed' / 'out'
    client = subprocess.Popen(
        [sys.executable, str(PIPELINES), 'keyed', '--sleep_ms', '60', '--output', str(prefix),
         '--runner=PortableRunner', '--job_endpoint=%s' % c.endpoint, '--num_workers=3'] +
        environment('LOOPBACK'),
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Kill a worker once the attempt runs (its SDK harnesses are busy napping:
    # 600 elements of 60 ms over six harnesses, about 6 s).
    deadline = time.time() + 120
    while 'job state' not in c.text() or 'RUNNING' not in c.text():
      assert time.time() < deadline, c.text()[-4000:]
      time.sleep(0.2)
    time.sleep(2)
    victim = c.worker_pids()[1]
    os.kill(victim, signal.SIGKILL)
    _, stderr = client.communicate(timeout=TIMEOUT)
    assert client.returncode == 0, stderr[-5000:] + c.text()[-5000:]
    assert 'attempt 1 failed: worker' in stderr and 'restarting the job (attempt 2 of 4)' in stderr, stderr[-4000:]
    assert read_output(prefix)[1] == direct(tmp_path, 'keyed')
    # The supervisor replaced the killed worker.
    c.wait_for_workers(4)
  finally:
    c.stop()


def test_a_streaming_job_whose_worker_dies_fails_naming_it(tmp_path):
  c = Cluster(tmp_path, 3)
  try:
    client = subprocess.Popen(
        [sys.executable, str(PIPELINES), 'unbounded', '--output', str(tmp_path / 'out' / 'o'),
         '--runner=PortableRunner', '--job_endpoint=%s' % c.endpoint, '--num_workers=3',
         '--streaming'] + environment('LOOPBACK'),
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while 'RUNNING' not in c.text():
      assert time.time() < deadline, c.text()[-4000:]
      time.sleep(0.2)
    time.sleep(4)
    os.kill(c.worker_pids()[2], signal.SIGKILL)
    _, stderr = client.communicate(timeout=TIMEOUT)
    assert client.returncode != 0
    assert 'was lost' in stderr and 'a streaming job is not restarted' in stderr, stderr[-4000:]
    assert 'FAILED' in stderr, stderr[-3000:]
  finally:
    c.stop()


def test_a_worker_with_the_wrong_token_is_refused(tmp_path):
  token = tmp_path / 'token'
  token.write_text('s3cret\n')
  c = Cluster(tmp_path, 0, extra=['--auth_token_file', str(token)])
  try:
    bad = subprocess.run(
        [str(WEIR_BIN), 'worker', '--coordinator', '127.0.0.1:%d' % c.cluster_port,
         '--auth_token', 'wrong'], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert "worker's token does not match" in bad.stderr, bad.stderr
    assert c.registered() == 0
  finally:
    c.stop()


def coordinator_args(token_file, staging):
  """`weir serve` as the Kubernetes coordinator runs it (deploy/k8s/coordinator.yaml)."""
  return ['serve', '--bind', '0.0.0.0', '--job_port', '8099', '--cluster_port', '8097',
          '--ui_port', '8074', '--auth_token_file', str(token_file), '--staging_dir', str(staging)]


def worker_args(coordinator_host, token_file, advertise_host):
  """`weir worker` as the Kubernetes StatefulSet runs it (deploy/k8s/workers.yaml)."""
  return ['worker', '--coordinator', '%s:8097' % coordinator_host, '--auth_token_file',
          str(token_file), '--advertise_host', advertise_host, '--timely_port', '2101']


def test_kubernetes_manifests_run_the_command_lines_tested_here():
  import yaml

  def container_args(path, kind):
    for doc in yaml.safe_load_all((REPO / 'deploy' / 'k8s' / path).read_text()):
      if doc and doc.get('kind') == kind:
        return doc['spec']['template']['spec']['containers'][0]['args']
    raise AssertionError('no %s in %s' % (kind, path))

  token, staging = '/etc/weir/token/token', '/var/lib/weir/staging'
  assert container_args('coordinator.yaml', 'Deployment') == coordinator_args(token, staging)
  assert container_args('workers.yaml', 'StatefulSet') == worker_args(
      'weir-coordinator', token, '$(POD_IP)')


def _ns(*args):
  subprocess.run(['ip'] + list(args), check=True, capture_output=True)


def _can_make_namespaces():
  if os.geteuid() != 0 or not shutil.which('ip'):
    return False
  probe = 'weir-test-probe-%d' % os.getpid()
  made = subprocess.run(['ip', 'netns', 'add', probe], capture_output=True).returncode == 0
  subprocess.run(['ip', 'netns', 'del', probe], capture_output=True)
  return made


@pytest.mark.skipif(not _can_make_namespaces(),
                    reason='network namespaces need root, iproute2 and CAP_SYS_ADMIN')
def test_two_machines_in_network_namespaces(tmp_path):
  """A coordinator and a worker in namespace A (10.77.0.1), a second worker
  in namespace B (10.77.0.2), joined by a veth pair: the job's timely
  traffic and the coordinator protocol cross the link."""
  a, b = 'weir-test-a-%d' % os.getpid(), 'weir-test-b-%d' % os.getpid()
  va, vb = 'wva%d' % (os.getpid() % 100000), 'wvb%d' % (os.getpid() % 100000)
  procs = []
  try:
    _ns('netns', 'add', a)
    _ns('netns', 'add', b)
    _ns('link', 'add', va, 'type', 'veth', 'peer', 'name', vb)
    _ns('link', 'set', va, 'netns', a)
    _ns('link', 'set', vb, 'netns', b)
    for ns, dev, ip in ((a, va, '10.77.0.1/24'), (b, vb, '10.77.0.2/24')):
      _ns('-n', ns, 'addr', 'add', ip, 'dev', dev)
      _ns('-n', ns, 'link', 'set', dev, 'up')
      _ns('-n', ns, 'link', 'set', 'lo', 'up')
    token = 'two-machines-token'
    token_file = tmp_path / 'token'
    token_file.write_text(token + '\n')
    env = dict(os.environ, RUST_LOG='info', NO_COLOR='1')
    log = open(tmp_path / 'coordinator.log', 'wb')
    # The command lines of deploy/k8s, with these machines' addresses.
    procs.append(subprocess.Popen(
        ['ip', 'netns', 'exec', a, str(WEIR_BIN)] +
        coordinator_args(token_file, tmp_path / 'staging'),
        stdout=log, stderr=subprocess.STDOUT, env=env))
    for ns, name, ip in ((a, 'machine-a', '10.77.0.1'), (b, 'machine-b', '10.77.0.2')):
      wlog = open(tmp_path / ('%s.log' % name), 'wb')
      procs.append(subprocess.Popen(
          ['ip', 'netns', 'exec', ns, str(WEIR_BIN)] + worker_args('10.77.0.1', token_file, ip) +
          ['--name', name],
          stdout=wlog, stderr=subprocess.STDOUT, env=env))
    deadline = time.time() + 60
    while (tmp_path / 'coordinator.log').read_text().count('worker registered') < 2:
      assert time.time() < deadline, (tmp_path / 'coordinator.log').read_text()[-4000:]
      time.sleep(0.2)
    prefix = tmp_path / 'out' / 'counts'
    client_env = dict(env, WEIR_AUTH_TOKEN=token,
                      PYTHONPATH=os.pathsep.join([str(REPO / 'python'), str(HERE)]))
    out = subprocess.run(
        ['ip', 'netns', 'exec', a, sys.executable, '-m', 'weir_auth', '-m',
         'apache_beam.examples.wordcount', '--input', king_lear_path(), '--output', str(prefix),
         '--runner=PortableRunner', '--job_endpoint=10.77.0.1:8099', '--num_workers=2',
         '--artifact_endpoint=10.77.0.1:8099'] + environment('PROCESS'),
        capture_output=True, text=True, timeout=TIMEOUT, env=client_env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-5000:]
    lines = read_output(prefix)[1]
    assert len(lines) == 4865 and lines['the: 786'] == 1
    assert '[machine-a]' in out.stderr and '[machine-b]' in out.stderr, out.stderr[-3000:]
    # machine-b's timely listener was on its own address, and elements crossed the link.
    assert '10.77.0.2' in (tmp_path / 'machine-b.log').read_text()
    crossed = re.search(r'exchanged (\d+) bytes', out.stderr)
    assert crossed and int(crossed.group(1)) > 0, out.stderr[-3000:]
  finally:
    for p in procs:
      p.terminate()
    for p in procs:
      try:
        p.wait(timeout=20)
      except subprocess.TimeoutExpired:
        p.kill()
    for ns in (a, b):
      subprocess.run(['ip', 'netns', 'del', ns], capture_output=True)
