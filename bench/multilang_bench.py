"""Multi-language benchmark: Java GenerateSequence -> Python Map -> count on
Weir, against the same transforms in one SDK (Python's Impulse + FlatMap(range)
+ Reshuffle -> Map -> count), in interleaved rounds.

  bench/multilang.sh [--n 1000000] [--rounds 3]

The multi-language job expands GenerateSequence with `weir expansion-service`
(Beam's Java expansion service, DOCKER environment run by Weir as
`weir boot --java`); the Python steps run LOOPBACK in the submitting process.
Prints, per variant, the median wall time and the CPU seconds of each
environment: the Java SDK harnesses (the CPU of the `weir serve`
process tree less the server's own: the harnesses are its children), the Python SDK (the client process: the LOOPBACK
harness plus pipeline construction and submission), the runner, and the
expansion service's JVM. Fails when a run's count or sum is wrong.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wordcount_bench import children_cpu  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WEIR = Path(os.environ.get('WEIR_BIN', REPO / 'target' / 'release' / 'weir'))
PIPELINES = REPO / 'tests' / 'e2e' / 'pipelines_multilang.py'
TICK = os.sysconf('SC_CLK_TCK')


def free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def wait_port(port, proc, what, timeout=180):
  deadline = time.time() + timeout
  while True:
    if proc.poll() is not None:
      sys.exit('%s exited (%s)' % (what, proc.returncode))
    try:
      socket.create_connection(('127.0.0.1', port), timeout=1).close()
      return
    except OSError:
      if time.time() > deadline:
        sys.exit('%s did not listen on %d' % (what, port))
      time.sleep(0.2)


def tree_cpu(pid):
  """CPU seconds (user + system) of pid and its live descendants."""
  total = 0.0
  try:
    with open('/proc/%d/stat' % pid) as f:
      fields = f.read().rsplit(')', 1)[1].split()
    total += (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / TICK
    with open('/proc/%d/task/%d/children' % (pid, pid)) as f:
      for child in f.read().split():
        total += tree_cpu(int(child))
  except OSError:
    pass
  return total


def own_cpu(pid):
  """CPU seconds (user + system) of pid alone."""
  with open('/proc/%d/stat' % pid) as f:
    fields = f.read().rsplit(')', 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / TICK


def run_once(variant, n, job_port, expansion, server_pid):
  argv = [sys.executable, str(PIPELINES), 'count', '--n', str(n),
          '--expansion_service', expansion if variant == 'multi' else 'none',
          '--runner=PortableRunner', '--job_endpoint=localhost:%d' % job_port,
          '--environment_type=LOOPBACK']
  before = children_cpu()
  server_tree, server_own = tree_cpu(server_pid), own_cpu(server_pid)
  start = time.time()
  proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
  wall = time.time() - start
  client_cpu = children_cpu() - before
  if proc.returncode != 0:
    sys.exit('%s run failed:\n%s' % (variant, proc.stderr[-5000:]))
  want = 'count=%d sum=%d' % (n, 3 * n * (n - 1) // 2)
  if want not in proc.stdout:
    sys.exit('%s run printed %r, want %r' % (variant, proc.stdout[-500:], want))
  # The SDK harnesses Weir starts (here: the Java environment's) are children
  # of `weir serve`, reaped when the job ends: the server tree's CPU less its own.
  runner = own_cpu(server_pid) - server_own
  sdk = max(0.0, tree_cpu(server_pid) - server_tree - runner)
  return {'wall': wall, 'python': client_cpu, 'java': sdk, 'runner': runner}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--n', type=int, default=1000000)
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--json', metavar='PATH', help='also write the results as JSON')
  args = parser.parse_args()

  job_port, exp_port = free_port(), free_port()
  logs = REPO / 'out' / 'bench-multilang'
  logs.mkdir(parents=True, exist_ok=True)
  env = dict(os.environ, NO_COLOR='1')
  server = subprocess.Popen(
      [str(WEIR), 'serve', '--job_port', str(job_port),
       '--python_for_docker_images', sys.executable],
      stdout=open(logs / 'weir.log', 'wb'), stderr=subprocess.STDOUT, env=env)
  expansion = subprocess.Popen(
      [str(WEIR), 'expansion-service', '--port', str(exp_port)],
      stdout=open(logs / 'expansion.log', 'wb'), stderr=subprocess.STDOUT, env=env)
  try:
    wait_port(job_port, server, 'weir serve')
    wait_port(exp_port, expansion, 'weir expansion-service')
    results = {'multi': [], 'single': []}
    for r in range(args.rounds):
      for variant in ('multi', 'single'):
        exp_before = tree_cpu(expansion.pid)
        res = run_once(variant, args.n, job_port, 'localhost:%d' % exp_port, server.pid)
        res['expansion'] = tree_cpu(expansion.pid) - exp_before
        results[variant].append(res)
        print('round %d %-6s wall %6.1f s  cpu: python %6.1f  java %6.1f  runner %6.1f  '
              'expansion %5.1f' % (r + 1, variant, res['wall'], res['python'], res['java'],
                                   res['runner'], res['expansion']), flush=True)
  finally:
    for p in (expansion, server):
      p.terminate()
      try:
        p.wait(30)
      except subprocess.TimeoutExpired:
        p.kill()

  def med(variant, key):
    return statistics.median(r[key] for r in results[variant])

  print()
  print('GenerateSequence(0, %d) -> Map(x * 3) -> sum and count, median of %d rounds'
        % (args.n, args.rounds))
  print('%-44s %8s %8s %8s %8s %9s' % ('', 'wall s', 'py CPU', 'java CPU', 'runner', 'expansion'))
  print('%-44s %8.1f %8.1f %8.1f %8.1f %9.1f' % (
      'multi-language (Java source, Python Map)', med('multi', 'wall'), med('multi', 'python'),
      med('multi', 'java'), med('multi', 'runner'), med('multi', 'expansion')))
  print('%-44s %8.1f %8.1f %8s %8.1f %9s' % (
      'one SDK (Python range, Python Map)', med('single', 'wall'), med('single', 'python'),
      '-', med('single', 'runner'), '-'))
  print('multi-language / one SDK wall time: %.2fx' % (med('multi', 'wall') / med('single', 'wall')))
  if args.json:
    rows = [dict(benchmark='multi-language', case='%s %d elements' % (variant, args.n),
                 runner='weir', env='LOOPBACK + Java PROCESS' if variant == 'multi' else 'LOOPBACK',
                 wall=med(variant, 'wall'), runner_cpu=med(variant, 'runner'),
                 sdk_cpu=med(variant, 'python') + med(variant, 'java'), rss_mib=None)
            for variant in ('multi', 'single')]
    with open(args.json, 'w') as f:
      json.dump({'benchmark': 'multilang', 'n': args.n, 'rounds': args.rounds, 'ok': True,
                 'rows': rows, 'results': results}, f, indent=1)


if __name__ == '__main__':
  main()
