"""Streaming latency benchmark: element-to-pane latency through a GroupByKey.

One streaming Python pipeline (--streaming, LOOPBACK environment):

    PeriodicImpulse(fire_interval=1/--rate s, for --seconds s, rebased to the
    job's start) -> Map(stamp: key = seq % --keys, creation wall time) ->
    WindowInto(GlobalWindows, trigger=Repeatedly(AfterCount(1)), DISCARDING)
    -> GroupByKey -> ParDo(for each element of each pane, write
    `scheduled emitted received` wall times to a file under the out dir)

run on
  * Weir: a fresh `weir serve`, submitted with PortableRunner;
  * Prism (--prism-bin, default bench/bin/prism or /work/prism-bin/prism):
    a fresh `prism --job_port N --serve_http=false`,
in interleaved rounds. The source is bounded (stop_timestamp), so the job
ends once its watermark passes the stop time.

Latency of an element = (wall time when the pane holding it reaches the DoFn
after the GroupByKey) - (wall time when the Map after the source created it).
Elements scheduled in the first --warmup seconds are not counted. Also shown:
the source lag (creation - scheduled fire time), i.e. how late the runner let
PeriodicImpulse's splittable DoFn resume (Weir waits at least `weir serve
--min_resume_delay_ms` between resumes), and their sum, end to end
(pane at the DoFn - scheduled fire time). Prints per runner and round the
element count, p50, p99, max latency (ms), wall time, runner and SDK CPU and
peak runner RSS. Exits 1 when a runner delivers fewer (or more) elements than
the source emitted (rate x seconds), i.e. when anything is lost or repeated.
Target for Weir: p99 < 50 ms (Dataflow's portable streaming documents ~6 s).

    bench/latency.sh [--seconds 20] [--rate 1000] [--keys 4] [--rounds 1]
                     [--runners weir,prism] [--json PATH]
"""

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import psutil

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

import wordcount_bench as wb  # noqa: E402
from wordcount_bench import REPO, log  # noqa: E402


# --- child: the pipeline --------------------------------------------------------
def child(argv):
  import uuid

  import apache_beam as beam
  from apache_beam.options.pipeline_options import PipelineOptions
  from apache_beam.transforms import trigger
  from apache_beam.transforms import window
  from apache_beam.transforms.periodicsequence import PeriodicImpulse
  from apache_beam.transforms.periodicsequence import RebaseMode
  from apache_beam.utils.timestamp import Timestamp

  seconds, rate, keys = float(argv[0]), int(argv[1]), int(argv[2])
  out_dir = argv[3]
  opts = argv[4:]
  interval_us = 1000000 // rate

  def stamp(t):
    us = t.micros if isinstance(t, Timestamp) else int(round(t * 1e6))
    return (us // interval_us) % keys, (us, time.time())

  class Record(beam.DoFn):
    """Writes `scheduled emitted received` (s since the epoch) per element."""

    def setup(self):
      self.f = None

    def start_bundle(self):
      if self.f is None:
        self.f = open(os.path.join(out_dir, 'lat-%d-%s.txt' % (os.getpid(), uuid.uuid4().hex)),
                      'a')

    def process(self, kv):
      now = time.time()
      self.f.write(''.join('%.6f %.6f %.6f\n' % (us / 1e6, emitted, now)
                           for us, emitted in kv[1]))

    def finish_bundle(self):
      if self.f is not None:
        self.f.flush()

    def teardown(self):
      if self.f is not None:
        self.f.close()
        self.f = None

  start = Timestamp.now()
  with beam.Pipeline(options=PipelineOptions(opts)) as p:
    _ = (
        p
        | PeriodicImpulse(start_timestamp=start, stop_timestamp=start + seconds,
                          fire_interval=1.0 / rate, rebase=RebaseMode.REBASE_ALL)
        | 'Stamp' >> beam.Map(stamp)
        | 'Window' >> beam.WindowInto(
            window.GlobalWindows(), trigger=trigger.Repeatedly(trigger.AfterCount(1)),
            accumulation_mode=trigger.AccumulationMode.DISCARDING)
        | beam.GroupByKey()
        | 'Record' >> beam.ParDo(Record()))


# --- runs -------------------------------------------------------------------------
def start_server(name, args, out_dir):
  return wb.start_job_server(name, args.weir_bin, args.prism_bin, out_dir, args.weir_flag)


def percentile(sorted_xs, q):
  if not sorted_xs:
    return float('nan')
  i = min(len(sorted_xs) - 1, max(0, int(round(q * (len(sorted_xs) - 1)))))
  return sorted_xs[i]


def read_latencies(out_dir, warmup):
  rows = []
  for name in glob.glob(os.path.join(out_dir, 'lat-*.txt')):
    with open(name) as f:
      for line in f:
        parts = line.split()
        if len(parts) == 3:
          rows.append(tuple(float(x) for x in parts))
  if not rows:
    return dict(total=0, distinct=0, count=0)
  first = min(r[0] for r in rows)
  distinct = len({round(r[0] * 1e6) for r in rows})
  kept = [r for r in rows if r[0] >= first + warmup]
  lat = sorted((r[2] - r[1]) * 1000 for r in kept)
  lag = sorted((r[1] - r[0]) * 1000 for r in kept)
  e2e = sorted((r[2] - r[0]) * 1000 for r in kept)
  return dict(total=len(rows), distinct=distinct, count=len(kept),
              p50_ms=percentile(lat, 0.50), p99_ms=percentile(lat, 0.99),
              max_ms=lat[-1] if lat else float('nan'),
              lag_p50_ms=percentile(lag, 0.50), lag_p99_ms=percentile(lag, 0.99),
              e2e_p50_ms=percentile(e2e, 0.50), e2e_p99_ms=percentile(e2e, 0.99))


def run_once(runner, args, out_dir):
  os.makedirs(out_dir)
  data_dir = os.path.join(out_dir, 'lat')
  os.makedirs(data_dir)
  cmd = [sys.executable, os.path.abspath(__file__), '--child', str(args.seconds),
         str(args.rate), str(args.keys), data_dir, '--streaming',
         '--runner=PortableRunner', '--environment_type=LOOPBACK'] + wb.PORTABLE_CLIENT
  server, port, logf = start_server(runner, args, out_dir)
  cmd.append('--job_endpoint=localhost:%d' % port)
  try:
    srv = psutil.Process(server.pid)
    cpu0 = wb._cpu(srv)
    peak = 0
    with open(os.path.join(out_dir, 'client.log'), 'wb') as clog:
      start = time.monotonic()
      client = subprocess.Popen(cmd, stdout=clog, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=out_dir)
      sampler = wb.Sampler(client)
      while client.poll() is None:
        sampler.sample()
        try:
          peak = max(peak, srv.memory_info().rss)
        except psutil.Error:
          pass
        if time.monotonic() - start > args.timeout:
          client.kill()
          client.wait()
          raise SystemExit('%s timed out after %.0f s; see %s' % (
              runner, args.timeout, os.path.join(out_dir, 'client.log')))
        time.sleep(args.interval)
      wall = time.monotonic() - start
    runner_cpu = wb._cpu(srv) - cpu0
  finally:
    wb.stop_server(server)
    logf.close()
  if client.returncode != 0:
    raise SystemExit('%s failed; see %s' % (runner, os.path.join(out_dir, 'client.log')))
  r = read_latencies(data_dir, args.warmup)
  r.update(wall=wall, runner_cpu=runner_cpu, sdk_cpu=sampler.client.cpu(),
           runner_rss=peak, client_rss=sampler.peak_rss)
  return r


def main():
  if len(sys.argv) > 1 and sys.argv[1] == '--child':
    return child(sys.argv[2:])
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--seconds', type=float, default=20, help='source duration, s')
  ap.add_argument('--rate', type=int, default=1000, help='elements per second')
  ap.add_argument('--keys', type=int, default=4)
  ap.add_argument('--warmup', type=float, default=1.0,
                  help='elements scheduled in the first WARMUP s are not counted')
  ap.add_argument('--rounds', type=int, default=1)
  ap.add_argument('--runners', default='weir,prism')
  ap.add_argument('--weir-bin', default=os.path.join(REPO, 'target', 'release', 'weir'))
  default_prism = os.path.join(BENCH, 'bin', 'prism')
  if not os.access(default_prism, os.X_OK):
    default_prism = '/work/prism-bin/prism'
  ap.add_argument('--prism-bin', default=default_prism)
  ap.add_argument('--weir-flag', action='append', default=[])
  ap.add_argument('--out-dir', default=os.path.join(BENCH, 'data', 'out', 'latency'))
  ap.add_argument('--interval', type=float, default=0.2)
  ap.add_argument('--timeout', type=float, default=600)
  ap.add_argument('--json', metavar='PATH', help='also write the results as JSON')
  args = ap.parse_args()
  args.weir_bin = os.path.abspath(args.weir_bin)
  runners = args.runners.split(',')
  expected = int(round(args.seconds * args.rate))

  load = os.getloadavg()
  results = []
  for rnd in range(args.rounds):
    order = runners if rnd % 2 == 0 else list(reversed(runners))
    for runner in order:
      out_dir = os.path.join(args.out_dir, '%s-%d' % (runner, rnd))
      shutil.rmtree(out_dir, ignore_errors=True)
      log('round %d: %s, %d elements/s for %g s' % (rnd + 1, runner, args.rate, args.seconds))
      r = run_once(runner, args, out_dir)
      r.update(runner=runner, round=rnd + 1)
      results.append(r)
      log('%s: %d elements, p50 %.1f ms, p99 %.1f ms, wall %.1f s' % (
          runner, r['total'], r.get('p50_ms', float('nan')), r.get('p99_ms', float('nan')),
          r['wall']))

  mib = 1024 * 1024
  print()
  print('Streaming GroupByKey latency: PeriodicImpulse %d elements/s for %g s (%d expected), '
        '%d keys, GlobalWindows Repeatedly(AfterCount(1)) DISCARDING, LOOPBACK; latency = '
        'pane at DoFn - element creation, elements of the first %g s not counted; '
        '%d cores, load avg at start %.1f/%.1f/%.1f'
        % ((args.rate, args.seconds, expected, args.keys, args.warmup,
            psutil.cpu_count() or 1) + load))
  row = '%-6s %5s %8s %8s %8s %8s %8s %11s %11s %8s %10s %8s %11s'
  print(row % ('runner', 'round', 'elements', 'counted', 'p50 ms', 'p99 ms', 'max ms',
               'src lag p99', 'e2e p99 ms', 'wall s', 'runner CPU', 'SDK CPU', 'runner MiB'))
  bad = 0
  for r in results:
    f = lambda k: '%.1f' % r[k] if k in r else '-'
    print(row % (r['runner'], r['round'], r['total'], r['count'], f('p50_ms'), f('p99_ms'),
                 f('max_ms'), f('lag_p99_ms'), f('e2e_p99_ms'), '%.1f' % r['wall'],
                 '%.2f' % r['runner_cpu'],
                 '%.2f' % r['sdk_cpu'], '%.0f' % (r['runner_rss'] / mib)))
  for r in results:
    if r['total'] != expected or r['distinct'] != expected:
      print('%s round %d delivered %d elements (%d distinct), expected %d' % (
          r['runner'], r['round'], r['total'], r['distinct'], expected))
      bad = 1
  weir = [r for r in results if r['runner'] == 'weir' and 'p99_ms' in r]
  if weir:
    worst = max(r['p99_ms'] for r in weir)
    print('weir p99 %.1f ms: target p99 < 50 ms %s' % (worst, 'met' if worst < 50 else 'NOT met'))
  if not bad:
    print('every runner delivered all %d elements exactly once' % expected)
  if args.json:
    med = lambda rs, k: statistics.median(r.get(k, float('nan')) for r in rs)
    rows = []
    for runner in runners:
      rs = [r for r in results if r['runner'] == runner]
      rows.append(dict(benchmark='streaming GBK latency', case='latency %g s x %d/s' % (
                           args.seconds, args.rate), runner=runner, env='LOOPBACK',
                       wall=med(rs, 'wall'), runner_cpu=med(rs, 'runner_cpu'),
                       sdk_cpu=med(rs, 'sdk_cpu'),
                       rss_mib=max(r['runner_rss'] + r['client_rss'] for r in rs) / mib,
                       runner_rss_mib=max(r['runner_rss'] for r in rs) / mib,
                       elements=min(r['total'] for r in rs), counted=min(r['count'] for r in rs),
                       p50_ms=med(rs, 'p50_ms'), p99_ms=max(r.get('p99_ms', float('nan')) for r in rs),
                       max_ms=max(r.get('max_ms', float('nan')) for r in rs),
                       e2e_p99_ms=max(r.get('e2e_p99_ms', float('nan')) for r in rs)))
    with open(args.json, 'w') as f:
      json.dump(dict(benchmark='latency', expected=expected, seconds=args.seconds,
                     rate=args.rate, keys=args.keys, warmup=args.warmup, ok=not bad,
                     rows=rows, results=results), f, indent=1)
  return bad


if __name__ == '__main__':
  sys.exit(main())
