"""GroupByKey scaling benchmark: Weir vs Prism vs Beam's DirectRunner.

One Python pipeline per size N (default 200k, 1M, 2M records):

    Impulse -> FlatMap(16 shards) -> Reshuffle -> FlatMap(N/16 records each:
    10-byte distinct keys, 90-byte values, like Beam's GBK load test on the
    synthetic source) -> GroupByKey -> Map(per-key digest of the sorted
    values) -> CombineGlobally(count, sum of digests) -> one output line

run on
  * Weir: a fresh `weir serve`, the job submitted with PortableRunner and the
    LOOPBACK environment (the SDK runs in the client process, so the server
    process's own CPU is the runner's), compared with Prism;
  * Weir PROCESS (runner `weir_process`): the same with SDK harnesses that
    Weir starts (`weir boot`, one per core), compared with DirectRunner's two
    worker processes: one LOOPBACK client is one Python interpreter, which
    runs the SDK work of 2M records on one core;
  * Prism (--prism-bin, default /work/prism-bin/prism or bench/bin/prism):
    a fresh `prism --job_port`, LOOPBACK too;
  * DirectRunner (multi_processing, 2 workers): no separate runner process.

Rounds are interleaved (size by size, runner by runner). Prints per run wall
time, runner CPU seconds (the job server process alone), SDK/client CPU
seconds, runner CPU per record (µs), peak runner RSS; then the ratios Weir /
Prism (both LOOPBACK) and Weir PROCESS / DirectRunner (both with two SDK
processes; Weir LOOPBACK when the PROCESS run is not asked for) of the same
run and Weir's runner CPU per record flatness (largest / smallest size, in
LOOPBACK, where the server's CPU is the runner's alone). Exits 1 when the runners' output lines
differ. Extra `weir serve` flags go in --weir-flag (repeatable), e.g.
--weir-flag=--gbk_memory_budget_mb=8 for the spill path.

    bench/gbk.sh [--sizes 200000,1000000,2000000]
                 [--runners weir,weir_process,prism,direct]
                 [--prism-max N] [--weir-flag F ...]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import psutil

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

import wordcount_bench as wb  # noqa: E402
from wordcount_bench import REPO, log  # noqa: E402

SHARDS = 16


# --- child: the pipeline --------------------------------------------------------
def child(argv):
  import hashlib
  import typing

  import apache_beam as beam
  from apache_beam.options.pipeline_options import PipelineOptions

  n = int(argv[0])
  out = argv[1]
  opts = argv[2:]

  def records(shard):
    # Distinct 10-byte keys: i -> i * 2654435761 mod 10^10 is a bijection.
    for i in range(shard, n, SHARDS):
      key = b'%010d' % ((i * 2654435761) % 10**10)
      yield key, b'v' * 80 + b'%010d' % i

  def digest(kv):
    h = hashlib.blake2b(kv[0], digest_size=8)
    for v in sorted(kv[1]):
      h.update(v)
    return int.from_bytes(h.digest(), 'big')

  class Sum(beam.CombineFn):
    def create_accumulator(self):
      return (0, 0)

    def add_input(self, acc, x):
      return (acc[0] + 1, (acc[1] + x) % (1 << 64))

    def merge_accumulators(self, accs):
      c, s = 0, 0
      for a in accs:
        c, s = c + a[0], (s + a[1]) % (1 << 64)
      return (c, s)

    def extract_output(self, acc):
      return 'groups=%d digest=%016x' % acc

  with beam.Pipeline(options=PipelineOptions(opts)) as p:
    lines = (
        p
        | beam.Impulse()
        | 'Shards' >> beam.FlatMap(lambda _: range(SHARDS))
        | beam.Reshuffle()
        | 'Records' >> beam.FlatMap(records).with_output_types(
            typing.Tuple[bytes, bytes])
        | beam.GroupByKey()
        | 'Digest' >> beam.Map(digest)
        | beam.CombineGlobally(Sum()))
    lines | beam.io.WriteToText(out, num_shards=1)


# --- runs -------------------------------------------------------------------------
def start_server(name, args, out_dir):
  return wb.start_job_server(name, args.weir_bin, args.prism_bin, out_dir, args.weir_flag)


def run_once(runner, n, args, out_dir):
  os.makedirs(out_dir)
  prefix = os.path.join(out_dir, 'out')
  py = sys.executable
  cmd = [py, os.path.abspath(__file__), '--child', str(n), prefix]
  server = None
  if runner == 'direct':
    cmd += ['--runner=DirectRunner', '--direct_num_workers=2',
            '--direct_running_mode=multi_processing']
  else:
    process = runner == 'weir_process'
    server, port, logf = start_server('weir' if process else runner, args, out_dir)
    cmd += ['--runner=PortableRunner', '--job_endpoint=localhost:%d' % port,
            '--environment_type=%s' % ('PROCESS' if process else 'LOOPBACK')]
    cmd += wb.PORTABLE_CLIENT
    if process:
      cmd.append(wb.process_environment_config(args.weir_bin, py))
  try:
    srv = psutil.Process(server.pid) if server else None
    cpu0 = wb._cpu(srv) if srv else 0.0
    harnesses0 = wb.tree_cpu_total(srv) if srv else 0.0
    peak = 0
    with open(os.path.join(out_dir, 'client.log'), 'wb') as clog:
      start = time.monotonic()
      client = subprocess.Popen(cmd, stdout=clog, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=out_dir)
      sampler = wb.Sampler(client, weir=server)
      while client.poll() is None:
        sampler.sample()
        if srv:
          try:
            peak = max(peak, srv.memory_info().rss)
          except psutil.Error:
            pass
        if time.monotonic() - start > args.timeout:
          client.kill()
          client.wait()
          raise SystemExit('%s %d timed out' % (runner, n))
        time.sleep(args.interval)
      wall = time.monotonic() - start
    # Before the server is stopped: once reaped, its CPU and its harnesses'
    # would count in the client's RUSAGE_CHILDREN too.
    client_cpu = sampler.client_cpu()
    runner_cpu = wb._cpu(srv) - cpu0 if srv else None
    harnesses1 = wb.tree_cpu_total(srv) if srv else 0.0
  finally:
    if server:
      wb.stop_server(server)
      logf.close()
  # SDK harnesses that Weir started (PROCESS): the kernel's count for the
  # server's tree when the client ended, else the last samples.
  harness_cpu = 0.0
  if server:
    harness_cpu = max(sampler.sdk.cpu(), harnesses1 - harnesses0)
  if client.returncode != 0:
    raise SystemExit('%s %d failed; see %s' % (runner, n, os.path.join(out_dir, 'client.log')))
  _, lines = wb.read_output(prefix)
  return dict(wall=wall, runner_cpu=runner_cpu, sdk_cpu=client_cpu + harness_cpu,
              runner_rss=peak if srv else None,
              # Peak of the sum: client tree, server and its SDK harnesses.
              total_rss=sampler.peak_rss,
              output=sorted(lines.elements()))


def main():
  if len(sys.argv) > 1 and sys.argv[1] == '--child':
    return child(sys.argv[2:])
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--sizes', default='200000,1000000,2000000')
  ap.add_argument('--runners', default='weir,weir_process,prism,direct')
  ap.add_argument('--prism-max', type=int, default=1000000,
                  help='skip Prism above this many records (it needs ~5 GiB at 1M)')
  ap.add_argument('--weir-bin', default=os.path.join(REPO, 'target', 'release', 'weir'))
  default_prism = os.path.join(BENCH, 'bin', 'prism')
  if not os.access(default_prism, os.X_OK):
    default_prism = '/work/prism-bin/prism'
  ap.add_argument('--prism-bin', default=default_prism)
  ap.add_argument('--weir-flag', action='append', default=[])
  ap.add_argument('--out-dir', default=os.path.join(BENCH, 'data', 'out', 'gbk'))
  ap.add_argument('--interval', type=float, default=0.2)
  ap.add_argument('--timeout', type=float, default=1800)
  ap.add_argument('--json', metavar='PATH', help='also write the results as JSON')
  args = ap.parse_args()
  args.weir_bin = os.path.abspath(args.weir_bin)
  sizes = [int(s) for s in args.sizes.split(',')]
  runners = args.runners.split(',')

  load = os.getloadavg()
  results = {}
  for n in sizes:
    for runner in runners:
      if runner == 'prism' and n > args.prism_max:
        continue
      out_dir = os.path.join(args.out_dir, '%s-%d' % (runner, n))
      shutil.rmtree(out_dir, ignore_errors=True)
      log('%s: GroupByKey of %d records' % (runner, n))
      r = run_once(runner, n, args, out_dir)
      results[(runner, n)] = r
      log('%s %d: %.1f s wall, runner CPU %s s, output %s' % (
          runner, n, r['wall'], '-' if r['runner_cpu'] is None else '%.2f' % r['runner_cpu'],
          r['output']))

  mib = 1024 * 1024
  print()
  print('GroupByKey scaling (10 B distinct keys, 90 B values), %d cores, load avg at '
        'start %.1f/%.1f/%.1f; Weir and Prism in LOOPBACK, Weir PROCESS (weir_process) '
        'with one SDK harness per core, DirectRunner multi_processing x2'
        % ((psutil.cpu_count() or 1,) + load))
  print('%-12s %9s %8s %10s %10s %11s %12s' % (
      'runner', 'records', 'wall s', 'runner CPU', 'SDK CPU s', 'runner us/r', 'runner MiB'))
  for n in sizes:
    for runner in runners:
      r = results.get((runner, n))
      if not r:
        continue
      rc = r['runner_cpu']
      print('%-12s %9d %8.2f %10s %10.2f %11s %12s' % (
          runner, n, r['wall'], '-' if rc is None else '%.2f' % rc, r['sdk_cpu'],
          '-' if rc is None else '%.2f' % (rc / n * 1e6),
          '-' if r['runner_rss'] is None else '%.0f' % (r['runner_rss'] / mib)))
  print()
  print('ratios (same run): wall and total CPU (runner + SDK), Weir / other')
  for n in sizes:
    for other in ('prism', 'direct'):
      mine = 'weir_process' if other == 'direct' and ('weir_process', n) in results else 'weir'
      w, o = results.get((mine, n)), results.get((other, n))
      if not w or not o:
        continue
      wt = (w['runner_cpu'] or 0) + w['sdk_cpu']
      ot = (o['runner_cpu'] or 0) + o['sdk_cpu']
      extra = ''
      if o['runner_cpu']:
        extra = '  runner CPU %.2f  runner RSS %.2f' % (
            w['runner_cpu'] / o['runner_cpu'], w['runner_rss'] / o['runner_rss'])
      print('  %9d %s/%-6s wall %.2f  CPU %.2f%s' % (n, mine, other, w['wall'] / o['wall'],
                                                     wt / ot, extra))
  per = [(n, results[('weir', n)]['runner_cpu'] / n * 1e6) for n in sizes
         if ('weir', n) in results]
  if len(per) > 1:
    print('weir runner CPU per record, largest/smallest size: %.2f (%.2f us -> %.2f us)' % (
        per[-1][1] / per[0][1], per[0][1], per[-1][1]))
  bad = 0
  for n in sizes:
    outs = {r: results[(r, n)]['output'] for r in runners if (r, n) in results}
    if len(set(map(tuple, outs.values()))) > 1:
      print('OUTPUTS DIFFER at %d: %s' % (n, outs))
      bad = 1
  if not bad:
    print('outputs identical across runners at every size')
  if args.json:
    mib = 1024 * 1024
    envs = {'weir': 'LOOPBACK', 'prism': 'LOOPBACK', 'weir_process': 'PROCESS',
            'direct': 'multi_processing x2'}
    # summary.py compares DirectRunner with the first Weir row of a case:
    # the PROCESS one, when there is one.
    order = {'weir_process': 0, 'weir': 1, 'prism': 2, 'direct': 3}
    rows = [dict(benchmark='GroupByKey (Python)', case='GBK %d records' % n,
                 runner='weir' if runner == 'weir_process' else runner, env=envs[runner],
                 wall=r['wall'], runner_cpu=r['runner_cpu'], sdk_cpu=r['sdk_cpu'],
                 rss_mib=r['total_rss'] / mib,
                 runner_rss_mib=r['runner_rss'] / mib if r.get('runner_rss') else None)
            for (runner, n), r in sorted(results.items(),
                                         key=lambda kv: (kv[0][1], order.get(kv[0][0], 9)))]
    with open(args.json, 'w') as f:
      json.dump(dict(benchmark='gbk', sizes=sizes, ok=not bad,
                     results=[dict(r, runner=k[0], records=k[1]) for k, r in results.items()],
                     rows=rows), f, indent=1)
  return bad


if __name__ == '__main__':
  sys.exit(main())
