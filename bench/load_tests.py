"""Beam's own Python load tests: Weir vs Beam's DirectRunner and Prism.

Runs the load tests shipped in the apache-beam wheel
(apache_beam.testing.load_tests: group_by_key_test, combine_test, pardo_test,
sideinput_test, co_group_by_key_test) on the synthetic source with a small,
fixed configuration, each one
  * under Weir: a fresh `weir serve` per test, the job submitted with
    PortableRunner and the PROCESS environment (`weir boot`), and
  * under DirectRunner with --direct_num_workers=2
    --direct_running_mode=multi_processing,
  * under Prism (--prism-bin, a fresh `prism --job_port N` per test) and, to
    compare in the same environment, under Weir again, both with LOOPBACK
    (runners `prism` and `weir_loopback`; Prism is skipped when no binary),
and prints per test the wall time of the client process on each runner, their
ratio, whether it succeeded on each, the load test's own `runtime` metric
(max - min of the MeasureTime distribution, whole seconds; '-' when the runner
reported no such metric), and CPU seconds: the runner's (the job server
process alone, sampled every 0.1 s) and the SDK's (the client process tree
as the kernel counts it once reaped, plus the SDK workers a Weir server starts
under PROCESS, reaped or alive at the end; all of DirectRunner).

Each test is run the way Beam documents it,
    python -m apache_beam.testing.load_tests.<module> --test-pipeline-options="..."
(LoadTest reads its options from TestPipeline, i.e. --test-pipeline-options),
through a thin wrapper (`load_tests.py --child <module> ...`) that only turns
on INFO logging first so that the ConsoleMetricsPublisher's metric lines are
visible (the modules' own logging.basicConfig is a no-op because an import
already configured the root logger). Nothing is published: no
--publish_to_big_query, no InfluxDB options.

A test that fails (or times out) is reported as FAILED with the first line of
its error; the full logs are kept under bench/data/out/load_tests/<test>/.

    bench/load_tests.sh [--records N] [--rounds N] [--runners weir,direct,weir_loopback,prism]
                        [--prism-bin PATH] [--tests gbk,combine,...]
                        [--extra=--opt=value ...] [--timeout S]
"""

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time

import psutil

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

import wordcount_bench as wb  # noqa: E402
from wordcount_bench import (  # noqa: E402
    REPO, free_port, log, process_environment_config, start_job_server, stop_server,
    wait_for_job_api)


# name -> (module, test-specific options). input_options are added by main().
def test_matrix(input_options):
  return [
      ('gbk', 'group_by_key_test', ['--fanout=1', '--iterations=1']),
      ('combine', 'combine_test', ['--fanout=1', '--top_count=20']),
      ('pardo', 'pardo_test', ['--iterations=1', '--number_of_counters=1',
                               '--number_of_counter_operations=1']),
      ('sideinput_iter', 'sideinput_test', ['--side_input_type=iter']),
      ('sideinput_dict', 'sideinput_test', ['--side_input_type=dict']),
      ('cogbk', 'co_group_by_key_test',
       ['--iterations=1', '--co_input_options=' + json.dumps(input_options)]),
  ]


# --- child: run one load test module as `python -m` would ----------------------
def child(argv):
  import logging
  import runpy
  module = 'apache_beam.testing.load_tests.' + argv[0]
  logging.basicConfig(level=logging.INFO)
  sys.argv = [module] + argv[1:]
  runpy.run_module(module, run_name='__main__', alter_sys=True)


# --- log parsing ------------------------------------------------------------------
EXC_RE = re.compile(r'^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure)\b.*)$')
METRIC_RE = re.compile(r'Metric: (\S+) Value: (-?\d+)')


def read(path):
  try:
    with open(path, encoding='utf-8', errors='replace') as f:
      return f.read()
  except OSError:
    return ''


def first_error_line(text):
  """First line of the first Python exception in a log (the line after the
  traceback), else the first ERROR log line, else the last non-empty line."""
  lines = text.splitlines()
  in_tb = False
  for line in lines:
    if line.startswith('Traceback (most recent call last)'):
      in_tb = True
      continue
    if in_tb and not line.startswith((' ', '\t')) and line.strip():
      if line.startswith(('During handling', 'The above exception')):
        continue
      return line.strip()
  for line in lines:
    if line.startswith('ERROR') or ' ERROR ' in line:
      return line.strip()
  for line in lines:
    m = EXC_RE.match(line.strip())
    if m:
      return m.group(1)
  rest = [l for l in lines if l.strip()]
  return rest[-1].strip() if rest else '(no output)'


def server_errors(text, limit=5):
  out = []
  for line in text.splitlines():
    if re.search(r'^\S+\s+ERROR\s', line):
      out.append(line.strip())
      if len(out) >= limit:
        break
  return out


def metrics(text):
  """Metric lines of the ConsoleMetricsPublisher; names are prefixed with the
  namespace ('default_runtime'), so 'runtime' is stored under both."""
  out = {}
  for m in METRIC_RE.finditer(text):
    out[m.group(1)] = int(m.group(2))
    if m.group(1).endswith('_runtime'):
      out['runtime'] = int(m.group(2))
  return out


# --- runs -------------------------------------------------------------------------
def run_client(py, module, opts, out_dir, timeout, server=None):
  log_path = os.path.join(out_dir, 'client.log')
  args = [py, os.path.abspath(__file__), '--child', module,
          '--test-pipeline-options=' + shlex.join(opts)]
  with open(log_path, 'w') as f:
    f.write('$ %s\n\n' % shlex.join(args))
  with open(log_path, 'ab') as out:
    client_cpu0 = wb.children_cpu()
    start = time.monotonic()
    client = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, cwd=out_dir)
    sampler = wb.Sampler(client, server)
    sampler.runner.sample([sampler.weir_proc] if server else [])
    sampler.runner.set_baseline()
    timed_out = False
    while True:
      sampler.sample()
      try:
        client.wait(timeout=0.1)
        break
      except subprocess.TimeoutExpired:
        pass
      if time.monotonic() - start > timeout:
        client.kill()
        client.wait()
        timed_out = True
        break
    rc = None if timed_out else client.returncode
    wall = time.monotonic() - start
    # The client and its descendants, reaped now: CPU as the kernel counts it.
    client_cpu = wb.children_cpu() - client_cpu0
    sdk_cpu = client_cpu
    if server:
      sampler.runner.sample([sampler.weir_proc])
      # A PROCESS server's SDK workers, live or reaped, since the server
      # started (a prewarmed fork server's import counts).
      sdk_cpu += wb.tree_cpu_total(sampler.weir_proc)
  text = read(log_path)
  r = dict(wall=wall, ok=(rc == 0), log=log_path, metrics=metrics(text),
           runner_cpu=sampler.runner.cpu() if server else None, sdk_cpu=sdk_cpu,
           # Peaks at the 0.1 s samples: the whole (client, server and its
           # SDK workers) and the server alone.
           peak_rss=sampler.peak_rss,
           runner_rss=sampler.runner.peak_rss if server else None)
  if timed_out:
    r['error'] = 'TIMEOUT after %.0f s' % timeout
  elif rc != 0:
    r['error'] = first_error_line(text.split('\n\n', 1)[-1])
  return r


def run_weir(py, weir_bin, module, opts, out_dir, timeout, prewarm=True):
  port = free_port()
  server_log = os.path.join(out_dir, 'weir-server.log')
  env = dict(os.environ)
  env.setdefault('RUST_LOG', 'info')
  env.setdefault('NO_COLOR', '1')
  with open(server_log, 'wb') as slog:
    # Prewarmed: this Python's fork server starts with the server, as on
    # a server that ran a job before.
    flags = ['--python_fork_server_prewarm=' + py] if prewarm else []
    weir = subprocess.Popen([weir_bin, 'serve', '--job_port', str(port), '--bind', '127.0.0.1']
                            + flags,
                            stdout=slog, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env)
    try:
      try:
        wait_for_job_api('localhost:%d' % port, weir, server_log)
      except SystemExit as e:
        return dict(wall=0.0, ok=False, log=server_log, metrics={},
                    server_log=server_log, server_errors=[],
                    error='weir serve did not start: %s' % e)
      runner_opts = ['--runner=PortableRunner', '--job_endpoint=localhost:%d' % port,
                     '--environment_type=PROCESS',
                     process_environment_config(weir_bin, py)] + wb.PORTABLE_CLIENT
      r = run_client(py, module, runner_opts + opts, out_dir, timeout, weir)
    finally:
      stop_server(weir)
  r['server_log'] = server_log
  if not r['ok']:
    r['server_errors'] = server_errors(read(server_log))
  return r


def run_loopback(name, py, weir_bin, prism_bin, module, opts, out_dir, timeout):
  """The test against a fresh `weir serve` (name 'weir') or Prism, LOOPBACK."""
  try:
    proc, port, logf = start_job_server(name, weir_bin, prism_bin, out_dir)
  except BaseException as e:  # noqa: BLE001  (SystemExit from wait_for_job_api)
    return dict(wall=0.0, ok=False, log=os.path.join(out_dir, '%s.log' % name), metrics={},
                error='%s did not start: %s' % (name, e))
  try:
    runner_opts = ['--runner=PortableRunner', '--job_endpoint=localhost:%d' % port,
                   '--environment_type=LOOPBACK'] + wb.PORTABLE_CLIENT
    r = run_client(py, module, runner_opts + opts, out_dir, timeout, proc)
  finally:
    stop_server(proc)
    logf.close()
  r['server_log'] = os.path.join(out_dir, '%s.log' % name)
  if not r['ok']:
    r['server_errors'] = server_errors(read(r['server_log']))
  return r


def run_direct(py, module, opts, out_dir, workers, timeout):
  runner_opts = ['--runner=DirectRunner', '--direct_num_workers=%d' % workers,
                 '--direct_running_mode=multi_processing']
  return run_client(py, module, runner_opts + opts, out_dir, timeout)


def shown(path):
  path = os.path.abspath(path)
  return os.path.relpath(path, REPO) if path.startswith(REPO + os.sep) else path


# --- report -------------------------------------------------------------------------
def median_result(rs, strict):
  """One test's rounds on one runner as one result: the last good run with
  the median wall time and CPU seconds of the good runs (each its own
  median); one round is itself. A failed round fails the result when
  `strict` (Weir's runs: no failure is averaged away) or when no round
  succeeded; a reference runner's good rounds stand otherwise, and its
  failed ones are listed (`failed_rounds`)."""
  ok = [r for r in rs if r['ok']]
  failed = [r for r in rs if not r['ok']]
  if failed and (strict or not ok):
    return dict(failed[0], rounds=len(rs), failed_rounds=failed)
  out = dict(ok[-1], rounds=len(rs), failed_rounds=failed)
  for k in ('wall', 'runner_cpu', 'sdk_cpu'):
    vals = [r[k] for r in ok if r.get(k) is not None]
    out[k] = statistics.median(vals) if vals else None
  for k in ('peak_rss', 'runner_rss'):
    vals = [r[k] for r in ok if r.get(k) is not None]
    out[k] = max(vals) if vals else None
  return out


def main():
  if len(sys.argv) > 1 and sys.argv[1] == '--child':
    return child(sys.argv[2:])

  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--records', type=int, default=20000, help='synthetic num_records')
  ap.add_argument('--key-size', type=int, default=10)
  ap.add_argument('--value-size', type=int, default=90)
  ap.add_argument('--tests', help='comma-separated subset of: gbk, combine, pardo, '
                  'sideinput_iter, sideinput_dict, cogbk')
  ap.add_argument('--weir-bin', default=os.path.join(REPO, 'target', 'release', 'weir'))
  ap.add_argument('--direct-workers', type=int, default=2)
  ap.add_argument('--only', choices=['weir', 'direct'], help='(old spelling of --runners)')
  ap.add_argument('--runners', default='weir,direct,weir_loopback,prism',
                  help='comma-separated: weir (PROCESS), direct, weir_loopback, prism (LOOPBACK)')
  ap.add_argument('--prism-bin', default=os.environ.get('PRISM_BIN', os.path.join(BENCH, 'bin', 'prism')))
  ap.add_argument('--out-dir', default=os.path.join(BENCH, 'data', 'out', 'load_tests'))
  ap.add_argument('--timeout', type=float, default=300, help='per run, s')
  ap.add_argument('--no-prewarm', action='store_true',
                  help='start `weir serve` without --python_fork_server_prewarm')
  ap.add_argument('--extra', action='append', default=[], metavar='OPT',
                  help='extra --test-pipeline-options entry for every test, e.g. '
                  '--extra=--access_percentage=0 (repeatable)')
  ap.add_argument('--rounds', type=int, default=1,
                  help='interleaved rounds of every test on every runner; results are medians')
  ap.add_argument('--json', metavar='PATH', help='also write the results as JSON')
  args = ap.parse_args()

  py = sys.executable
  weir_bin = os.path.abspath(args.weir_bin)
  if args.only != 'direct' and not os.access(weir_bin, os.X_OK):
    raise SystemExit('missing %s; run scripts/setup.sh' % weir_bin)
  input_options = {'num_records': args.records, 'key_size': args.key_size,
                   'value_size': args.value_size}
  common = ['--publish_to_big_query=false',
            '--input_options=' + json.dumps(input_options)] + args.extra
  tests = test_matrix(input_options)
  if args.tests:
    wanted = args.tests.split(',')
    unknown = set(wanted) - {t[0] for t in tests}
    if unknown:
      raise SystemExit('unknown tests: %s' % ', '.join(sorted(unknown)))
    tests = [t for t in tests if t[0] in wanted]
  runners = [args.only] if args.only else [n for n in args.runners.split(',') if n]
  unknown = set(runners) - {'weir', 'direct', 'weir_loopback', 'prism'}
  if unknown:
    raise SystemExit('unknown runners: %s' % ', '.join(sorted(unknown)))
  prism_bin = os.path.abspath(args.prism_bin)
  if 'prism' in runners and not os.access(prism_bin, os.X_OK):
    log('no Prism binary at %s: prism skipped (--prism-bin)' % prism_bin)
    runners = [r for r in runners if r != 'prism']

  # Interleaved rounds: every test on every runner, then again; each round
  # starts one runner later, so that none always runs first or last.
  runs = {}
  for rnd in range(args.rounds):
    shift = rnd % len(runners) if runners else 0
    for name, module, opts in tests:
      for runner in runners[shift:] + runners[:shift]:
        out_dir = os.path.join(args.out_dir, name, runner)
        shutil.rmtree(out_dir, ignore_errors=True)
        os.makedirs(out_dir)
        log('%s: %s %s' % (runner, module, ' '.join(opts)))
        if runner == 'weir':
          r = run_weir(py, weir_bin, module, opts + common, out_dir, args.timeout,
                       prewarm=not args.no_prewarm)
        elif runner in ('weir_loopback', 'prism'):
          r = run_loopback('weir' if runner == 'weir_loopback' else 'prism', py, weir_bin,
                           prism_bin, module, opts + common, out_dir, args.timeout)
        else:
          r = run_direct(py, module, opts + common, out_dir, args.direct_workers,
                         args.timeout)
        runs.setdefault((name, runner), []).append(r)
        log('%s/%s%s: %s in %.1f s%s' % (
            name, runner, ' round %d' % (rnd + 1) if args.rounds > 1 else '',
            'ok' if r['ok'] else 'FAILED', r['wall'], '' if r['ok'] else ': ' + r['error']))
  results = {k: median_result(rs, strict=k[1] in ('weir', 'weir_loopback'))
             for k, rs in runs.items()}

  print()
  print('Beam load tests (apache_beam.testing.load_tests), synthetic source %s; '
        'weir PROCESS env vs direct (multi_processing, %d workers)%s' %
        (json.dumps(input_options), args.direct_workers,
         '; medians of %d interleaved rounds' % args.rounds if args.rounds > 1 else ''))
  print('%-15s %9s %9s %7s  %-7s %-7s %15s %10s %9s %7s' % (
      'test', 'weir s', 'direct s', 'w/d', 'weir', 'direct', 'runtime w/d s',
      'weir LB s', 'prism s', 'wLB/p'))

  def cell(r, fmt):
    return fmt(r) if r else '-'

  failed = 0
  for name, _, _ in tests:
    w, d = results.get((name, 'weir')), results.get((name, 'direct'))
    ratio = '%.2f' % (w['wall'] / d['wall']) if w and d and w['ok'] and d['ok'] else '-'
    rt = '%s/%s' % (cell(w, lambda r: str(r['metrics'].get('runtime', '-'))),
                    cell(d, lambda r: str(r['metrics'].get('runtime', '-'))))
    wl, p = results.get((name, 'weir_loopback')), results.get((name, 'prism'))
    lb_ratio = '%.2f' % (wl['wall'] / p['wall']) if wl and p and wl['ok'] and p['ok'] else '-'
    wall = lambda r: ('%.2f' % r['wall']) if r['ok'] else 'FAILED'
    print('%-15s %9s %9s %7s  %-7s %-7s %15s %10s %9s %7s' % (
        name, cell(w, lambda r: '%.2f' % r['wall']), cell(d, lambda r: '%.2f' % r['wall']),
        ratio, cell(w, lambda r: 'ok' if r['ok'] else 'FAILED'),
        cell(d, lambda r: 'ok' if r['ok'] else 'FAILED'), rt,
        cell(wl, wall), cell(p, wall), lb_ratio))
    failed += sum(1 for r in (w, d, wl, p) if r and not r['ok'])

  print()
  print('CPU seconds, runner (job server) + SDK; ratios of the totals')
  print('%-15s %15s %15s %15s %15s %7s %7s' % (
      'test', 'weir', 'direct', 'weir LB', 'prism', 'w/d', 'wLB/p'))

  def cpu(r):
    if not r or not r['ok']:
      return None
    return (r['runner_cpu'] or 0.0) + r['sdk_cpu']

  def cpu_cell(r):
    if not r or not r['ok']:
      return '-'
    if r['runner_cpu'] is None:
      return '%.2f' % r['sdk_cpu']
    return '%.2f+%.2f' % (r['runner_cpu'], r['sdk_cpu'])

  def cpu_ratio(a, b):
    return '%.2f' % (cpu(a) / cpu(b)) if cpu(a) and cpu(b) else '-'

  for name, _, _ in tests:
    w, d = results.get((name, 'weir')), results.get((name, 'direct'))
    wl, p = results.get((name, 'weir_loopback')), results.get((name, 'prism'))
    print('%-15s %15s %15s %15s %15s %7s %7s' % (
        name, cpu_cell(w), cpu_cell(d), cpu_cell(wl), cpu_cell(p),
        cpu_ratio(w, d), cpu_ratio(wl, p)))

  if args.json:
    envs = dict(weir='PROCESS', weir_loopback='LOOPBACK', prism='LOOPBACK',
                direct='multi_processing x%d' % args.direct_workers)
    rows = [dict(benchmark='load test %s' % name, case='load test %s %d records' % (
                     name, args.records), runner='weir' if runner == 'weir_loopback' else runner,
                 env=envs[runner],
                 wall=r['wall'] if r['ok'] else None,
                 runner_cpu=r['runner_cpu'] if r['ok'] else None,
                 sdk_cpu=r['sdk_cpu'] if r['ok'] else None,
                 rss_mib=r['peak_rss'] / 2**20 if r['ok'] and r.get('peak_rss') else None,
                 runner_rss_mib=(r['runner_rss'] / 2**20
                                 if r['ok'] and r.get('runner_rss') else None),
                 ok=r['ok'])
            for (name, runner), r in results.items()]
    with open(args.json, 'w') as f:
      json.dump(dict(benchmark='load_tests', input_options=input_options, ok=not failed,
                     rounds=args.rounds,
                     rows=rows,
                     results=[dict(r, test=k[0], runner=k[1]) for k, r in results.items()]),
                f, indent=1)
  flaky = [(k, r) for k, r in results.items() if r['ok'] and r['failed_rounds']]
  for (name, runner), r in flaky:
    print('%s under %s failed in %d of %d rounds (the medians are of the others): %s' % (
        name, runner, len(r['failed_rounds']), r['rounds'], r['failed_rounds'][0]['error']))
  if failed:
    print()
    print('failures:')
    for name, _, _ in tests:
      for runner in runners:
        r = results[(name, runner)]
        if r['ok']:
          continue
        print('  %s under %s: FAILED: %s' % (name, runner, r['error']))
        print('    client log: %s' % shown(r['log']))
        if runner != 'direct' and r.get('server_log'):
          print('    server log: %s' % shown(r['server_log']))
          for line in r.get('server_errors', []):
            print('      %s' % line[:300])
  return 1 if failed else 0


if __name__ == '__main__':
  sys.exit(main())
