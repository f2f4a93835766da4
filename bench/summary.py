"""Collects the --json results of the benchmarks into one Markdown summary and
a chart (called by bench/all.sh).

Each benchmark's JSON has `rows`: one per (case, runner[, environment]) with
wall s, runner CPU s (the job server process; none for DirectRunner), SDK
CPU s (everything else: SDK harnesses and the client), peak RSS MiB (runner +
SDK) and the runner's own peak RSS MiB. Writes
  * OUT/summary.md: one table of every row, with the Weir / other ratios of
    wall time, total CPU (runner + SDK) and runner RSS of the same case, the latency
    table, and each benchmark's status (ok, FAILED, not run);
  * OUT/ratios.png: bars of Weir/Prism and Weir/DirectRunner, wall and CPU,
    per case (log scale; below 1 means Weir is faster or cheaper).

    python bench/summary.py OUT_DIR [--status NAME=ok|failed|skipped ...]
"""

import argparse
import json
import math
import os
import sys

ORDER = ('wordcount', 'load_tests', 'load_tests_1m', 'gbk', 'polyglot', 'polyglot_direct', 'latency', 'trivial', 'multilang')


def fmt(x, digits=2):
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return '-'
  return '%.*f' % (digits, x)


def total_cpu(r):
  if r.get('sdk_cpu') is None:
    return None
  return (r.get('runner_cpu') or 0.0) + r['sdk_cpu']


def weir_for(rows, case, other):
  """The Weir row to compare `other` with: same case, same environment if
  there is one, else the first."""
  ws = [r for r in rows if r['case'] == case and r['runner'] == 'weir']
  same = [r for r in ws if r.get('env') == other.get('env')]
  return (same or ws or [None])[0]


def ratio(a, b):
  if a is None or b is None or b == 0 or (isinstance(a, float) and math.isnan(a)):
    return None
  return a / b


def main():
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('out_dir')
  ap.add_argument('--status', action='append', default=[], metavar='NAME=STATUS')
  ap.add_argument('--title', default='Weir benchmarks')
  ap.add_argument('--note', default='')
  args = ap.parse_args()
  status = dict(s.split('=', 1) for s in args.status)

  docs = {}
  for name in ORDER:
    path = os.path.join(args.out_dir, '%s.json' % name)
    if os.path.exists(path):
      with open(path) as f:
        docs[name] = json.load(f)

  rows = []
  for name in ORDER:
    # A case another benchmark also has (polyglot and polyglot_direct on the
    # same input under --quick) is told apart by its benchmark, so ratios
    # compare rows of one benchmark only.
    earlier = {r['case'] for r in rows}
    rows += [dict(r, bench=name, case=('%s [%s]' % (r['case'], name)
                                       if r['case'] in earlier else r['case']))
             for r in docs.get(name, {}).get('rows', [])]

  ratios = []   # (case, other runner, wall ratio, cpu ratio)
  lines = ['# %s' % args.title, '']
  if args.note:
    lines += [args.note, '']
  lines += ['Wall time, CPU seconds of the runner (the job server process) and of the SDK '
            '(harnesses and client; all of DirectRunner), peak RSS of runner + SDK and of '
            'the runner alone (sampled every 0.1 s or so). '
            'Ratios are Weir / this row, for the same case (Weir in the same environment '
            'where there is one): below 1 means Weir is faster or cheaper. CPU is runner + SDK; '
            'RSS is the runner\'s (the job server process; DirectRunner has none).',
            '',
            '| benchmark | case | runner | environment | wall s | CPU s runner | CPU s SDK '
            '| peak RSS MiB | runner RSS MiB | Weir/this wall | Weir/this CPU '
            '| Weir/this runner RSS |',
            '|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|']
  for r in rows:
    wr = cr = rr = None
    if r['runner'] != 'weir':
      w = weir_for(rows, r['case'], r)
      if w:
        wr = ratio(w.get('wall'), r.get('wall'))
        cr = ratio(total_cpu(w), total_cpu(r))
        rr = ratio(w.get('runner_rss_mib'), r.get('runner_rss_mib'))
        ratios.append((r['case'], r['runner'], wr, cr))
    lines.append('| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |' % (
        r['benchmark'], r['case'], r['runner'], r.get('env', ''), fmt(r.get('wall')),
        fmt(r.get('runner_cpu')), fmt(r.get('sdk_cpu')), fmt(r.get('rss_mib'), 0),
        fmt(r.get('runner_rss_mib'), 0), fmt(wr), fmt(cr), fmt(rr)))

  lat = docs.get('latency')
  if lat:
    lines += ['', '## Streaming GroupByKey latency', '',
              'PeriodicImpulse %d elements/s for %g s (%d expected), %d keys, GlobalWindows, '
              'Repeatedly(AfterCount(1)), DISCARDING, LOOPBACK; latency = pane at the DoFn after '
              'the GroupByKey - element creation; the first %g s not counted. Target for Weir: '
              'p99 < 50 ms. Source lag = element creation - scheduled fire time; end to end = '
              'pane at the DoFn - scheduled fire time.' % (
                  lat['rate'], lat['seconds'], lat['expected'], lat['keys'], lat['warmup']),
              '',
              '| runner | round | elements | counted | p50 ms | p99 ms | max ms '
              '| source lag p99 ms | end to end p99 ms | SDK CPU s |',
              '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|']
    for r in lat['results']:
      lines.append('| %s | %d | %d | %d | %s | %s | %s | %s | %s | %s |' % (
          r['runner'], r['round'], r['total'], r['count'], fmt(r.get('p50_ms'), 1),
          fmt(r.get('p99_ms'), 1), fmt(r.get('max_ms'), 1), fmt(r.get('lag_p99_ms'), 1),
          fmt(r.get('e2e_p99_ms'), 1), fmt(r.get('sdk_cpu'), 2)))

  triv = docs.get('trivial')
  if triv:
    lines += ['', '## Trivial pipeline (fixed cost)', '',
              '`Create([1,2,3]) | Map(x*2)`, submit to DONE of a warm job, median of %d '
              'rounds.' % triv['rounds'], '', '| configuration | median s |', '|---|---:|']
    for c, m in triv['medians'].items():
      lines.append('| %s | %.3f |' % (c, m))

  lines += ['', '## Status', '', '| benchmark | status | log |', '|---|---|---|']
  for name in ORDER:
    st = status.get(name)
    if st is None and name not in docs:
      continue
    if st is None:
      st = 'ok' if docs[name].get('ok', True) else 'FAILED'
    lines.append('| %s | %s | %s.txt |' % (name, st, name))
  lines.append('')
  with open(os.path.join(args.out_dir, 'summary.md'), 'w') as f:
    f.write('\n'.join(lines))

  try:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
  except ImportError:
    print('matplotlib missing: no ratios.png (pip install -r bench/requirements.txt)',
          file=sys.stderr)
    return 0
  cases = []
  for case, _, _, _ in ratios:
    if case not in cases:
      cases.append(case)
  series = [('prism', 'wall'), ('prism', 'CPU'), ('direct', 'wall'), ('direct', 'CPU')]
  colors = ['#1f77b4', '#aec7e8', '#d62728', '#ff9896']
  fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(cases) + 2), 5))
  width = 0.2
  for i, (other, what) in enumerate(series):
    xs, ys = [], []
    for j, case in enumerate(cases):
      for c, o, wr, cr in ratios:
        v = wr if what == 'wall' else cr
        if c == case and o == other and v:
          xs.append(j + (i - 1.5) * width)
          ys.append(v)
          break
    if xs:
      # Bars grow from 1 (parity), up when Weir is slower, down when faster.
      ax.bar(xs, [y - 1 for y in ys], width, bottom=1,
             label='Weir/%s %s' % ('Prism' if other == 'prism' else 'DirectRunner', what),
             color=colors[i])
      for x, y in zip(xs, ys):
        ax.annotate('%.2f' % y, (x, y), ha='center', va='bottom' if y >= 1 else 'top',
                    fontsize=7)
  ax.axhline(1.0, color='black', linewidth=0.8)
  ax.set_yscale('log')
  from matplotlib.ticker import ScalarFormatter
  for axis in (ax.yaxis,):
    axis.set_major_formatter(ScalarFormatter())
    axis.set_minor_formatter(ScalarFormatter())
  ax.tick_params(axis='y', which='minor', labelsize=7)
  ax.set_xticks(range(len(cases)))
  ax.set_xticklabels(cases, rotation=30, ha='right', fontsize=8)
  ax.set_ylabel('Weir / other (log; < 1: Weir faster or cheaper)')
  ax.set_title(args.title)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(os.path.join(args.out_dir, 'ratios.png'), dpi=100)
  return 0


if __name__ == '__main__':
  sys.exit(main())
