"""Trivial pipeline benchmark: a runner's fixed cost per job.

    Create([1, 2, 3]) | Map(lambda x: x * 2)

submitted, warm, to
  * Weir, LOOPBACK environment (the SDK harness in the client process);
  * Weir, PROCESS environment (`weir boot --python <venv python>` starts the
    SDK workers);
  * Prism (`prism --job_port N --serve_http=false`), LOOPBACK;
  * Prism, PROCESS environment, starting the same SDK workers as Weir's
    (`weir boot --python <venv python>` through a wrapper script; Prism
    starts one per environment, Weir one per core);
  * DirectRunner (Beam Python's in-memory FnApiRunner, no job server).
"Warm" means: one `weir serve` and one `prism` are started before the first
round and serve every round, and each round's client process first runs one
untimed job (imports, gRPC channels, the LOOPBACK worker server) and then
times `pipeline.run()` -> `wait_until_finish()` returning DONE for a second
job. Rounds are interleaved across the configurations. Prints per
configuration the median, min and max submit->DONE wall time, the runner's
CPU seconds per job (the job server process, over the client's two jobs,
halved), the same for the server's children (the SDK workers it starts under
PROCESS; LOOPBACK runs them in the client) and the ratios Weir / other.

    bench/trivial.py [--rounds 5] [--configs weir-loopback,weir-process,prism,prism-process,direct]
                     [--json PATH] [--extra=OPT ...]

--extra adds a pipeline option to the Weir configurations (an A/B run of it).
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

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

import wordcount_bench as wb  # noqa: E402
from wordcount_bench import REPO, log  # noqa: E402

CONFIGS = ('weir-loopback', 'weir-process', 'prism', 'prism-process', 'direct')


# --- child: warm-up job, then the timed job ----------------------------------------
def child(argv):
  import apache_beam as beam
  from apache_beam.options.pipeline_options import PipelineOptions
  from apache_beam.runners.runner import PipelineState

  times = []
  for _ in range(2):
    p = beam.Pipeline(options=PipelineOptions(argv))
    _ = p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x * 2)
    start = time.monotonic()
    result = p.run()
    state = result.wait_until_finish()
    times.append(time.monotonic() - start)
    if state != PipelineState.DONE:
      raise SystemExit('job ended %s' % state)
  print('TRIVIAL_TIMES %s' % json.dumps(times), flush=True)


def start_server(name, args, out_dir):
  return wb.start_job_server(name, args.weir_bin, args.prism_bin, out_dir)


def tree_cpu(proc):
  """CPU seconds of a server alone, and of everything below it, live or
  reaped (the SDK workers it started under PROCESS; Weir's Python fork
  server and the harnesses it forks)."""
  return wb._cpu(proc), wb.tree_cpu_total(proc)


def server_of(config):
  """The job server a configuration submits to: 'weir' or 'prism'."""
  return config.split('-')[0]


def options(config, ports, args):
  py = sys.executable
  if config == 'direct':
    return ['--runner=DirectRunner']
  server = server_of(config)
  opts = ['--runner=PortableRunner', '--job_endpoint=localhost:%d' % ports[server]]
  opts += wb.PORTABLE_CLIENT
  if config == 'weir-process':
    opts += ['--environment_type=PROCESS', wb.process_environment_config(args.weir_bin, py)]
  elif config == 'prism-process':
    opts += ['--environment_type=PROCESS',
             wb.prism_process_config(args.weir_bin, py, args.out_dir)]
  else:
    opts += ['--environment_type=LOOPBACK']
  if config.startswith('weir'):
    opts += args.extra
  return opts


def run_once(config, ports, servers, args, out_dir):
  server = None if config == 'direct' else servers[server_of(config)]
  cmd = [sys.executable, os.path.abspath(__file__), '--child'] + options(config, ports, args)
  log_path = os.path.join(out_dir, '%s.log' % config)
  cpu0 = tree_cpu(server) if server else (0.0, 0.0)
  with open(log_path, 'ab') as out:
    start = time.monotonic()
    client = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=out, stdin=subprocess.DEVNULL,
                            cwd=out_dir, timeout=args.timeout)
    wall = time.monotonic() - start
  text = client.stdout.decode('utf-8', 'replace')
  with open(log_path, 'a') as out:
    out.write(text)
  if client.returncode != 0:
    raise SystemExit('%s failed (exit %d); see %s' % (config, client.returncode, log_path))
  times = None
  for line in text.splitlines():
    if line.startswith('TRIVIAL_TIMES '):
      times = json.loads(line.split(' ', 1)[1])
  if not times:
    raise SystemExit('%s printed no times; see %s' % (config, log_path))
  runner_cpu = sdk_cpu = None
  if server:
    cpu1 = tree_cpu(server)
    runner_cpu, sdk_cpu = (cpu1[0] - cpu0[0]) / 2, (cpu1[1] - cpu0[1]) / 2
  return dict(job=times[-1], warmup_job=times[0], process_wall=wall, runner_cpu=runner_cpu,
              server_children_cpu=sdk_cpu)


def main():
  if len(sys.argv) > 1 and sys.argv[1] == '--child':
    return child(sys.argv[2:])
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--rounds', type=int, default=5)
  ap.add_argument('--configs', default=','.join(CONFIGS))
  ap.add_argument('--weir-bin', default=os.path.join(REPO, 'target', 'release', 'weir'))
  default_prism = os.path.join(BENCH, 'bin', 'prism')
  if not os.access(default_prism, os.X_OK):
    default_prism = '/work/prism-bin/prism'
  ap.add_argument('--prism-bin', default=default_prism)
  ap.add_argument('--out-dir', default=os.path.join(BENCH, 'data', 'out', 'trivial'))
  ap.add_argument('--timeout', type=float, default=300, help='per client, s')
  ap.add_argument('--json', metavar='PATH', help='also write the results as JSON')
  ap.add_argument('--extra', action='append', default=[], metavar='OPT',
                  help='a pipeline option for the Weir runs, e.g. '
                       '--extra=--number_of_worker_harness_threads=1 (repeatable)')
  args = ap.parse_args()
  args.weir_bin = os.path.abspath(args.weir_bin)
  configs = args.configs.split(',')
  unknown = set(configs) - set(CONFIGS)
  if unknown:
    raise SystemExit('unknown configs: %s' % ', '.join(sorted(unknown)))

  shutil.rmtree(args.out_dir, ignore_errors=True)
  os.makedirs(args.out_dir)
  load = os.getloadavg()
  wanted = {server_of(c) for c in configs if c != 'direct'}
  servers, ports, logs = {}, {}, []
  results = {c: [] for c in configs}
  try:
    for name in sorted(wanted):
      proc, port, logf = start_server(name, args, args.out_dir)
      servers[name], ports[name] = psutil.Process(proc.pid), port
      logs.append((proc, logf))
    for rnd in range(args.rounds):
      order = configs if rnd % 2 == 0 else list(reversed(configs))
      for config in order:
        r = run_once(config, ports, servers, args, args.out_dir)
        results[config].append(r)
        log('round %d: %s submit->DONE %.2f s (warm-up job %.2f s)' % (
            rnd + 1, config, r['job'], r['warmup_job']))
  finally:
    for proc, logf in logs:
      wb.stop_server(proc)
      logf.close()

  med = {c: statistics.median(r['job'] for r in results[c]) for c in configs}
  print()
  print('Trivial pipeline Create([1,2,3]) | Map(x*2): submit->DONE wall time of a warm job '
        '(server already running, client warmed by one job), %d round(s) interleaved; '
        '%d cores, load avg at start %.1f/%.1f/%.1f' % (
            (args.rounds, psutil.cpu_count() or 1) + load))
  row = '%-14s %9s %8s %8s %15s %17s'
  print(row % ('config', 'median s', 'min s', 'max s', 'runner CPU/job', 'its workers/job'))
  for c in configs:
    rs = results[c]
    cpus = [r['runner_cpu'] for r in rs if r['runner_cpu'] is not None]
    kids = [r['server_children_cpu'] for r in rs if r['server_children_cpu'] is not None]
    print(row % (c, '%.3f' % med[c], '%.3f' % min(r['job'] for r in rs),
                 '%.3f' % max(r['job'] for r in rs),
                 '%.3f' % statistics.median(cpus) if cpus else '-',
                 '%.3f' % statistics.median(kids) if kids else '-'))
  print()
  # Each Weir configuration against Prism in the same environment, and DirectRunner.
  peers = {'weir-loopback': ('prism', 'direct'), 'weir-process': ('prism-process', 'direct')}
  for w, others in peers.items():
    if w not in med:
      continue
    parts = ['%s/%s %.2f' % (w, o, med[w] / med[o]) for o in others if o in med]
    if parts:
      print('ratios (median wall): ' + ', '.join(parts))
  if args.json:
    with open(args.json, 'w') as f:
      rows = []
      for c in configs:
        rs = results[c]
        cpus = [r['runner_cpu'] for r in rs if r['runner_cpu'] is not None]
        kids = [r['server_children_cpu'] for r in rs if r['server_children_cpu'] is not None]
        rows.append(dict(benchmark='trivial pipeline', case='trivial Create+Map',
                         runner=c.split('-')[0], env=(c.split('-')[1].upper() if '-' in c else
                                                      'LOOPBACK' if c == 'prism' else 'in_memory'),
                         wall=med[c], runner_cpu=statistics.median(cpus) if cpus else None,
                         sdk_cpu=statistics.median(kids) if kids and c.endswith('-process') else None,
                         rss_mib=None))
      json.dump(dict(benchmark='trivial', rounds=args.rounds, medians=med, rows=rows,
                     results=results), f, indent=1)
  return 0


if __name__ == '__main__':
  sys.exit(main())
