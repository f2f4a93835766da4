"""User state of stateful DoFns (Python SDK kinds) on Weir.

Each pipeline of pipelines_state.py runs under Weir (LOOPBACK and PROCESS)
and under Beam's DirectRunner; the outputs must be equal, and equal to the
lines worked out here from the input (so a DirectRunner change cannot make
the test pass vacuously):

* ReadModifyWrite (value), Bag, CombiningValue and Set state
  (`beam:user_state:bag:v1` in the Python SDK);
* OrderedList state (`beam:user_state:ordered_list:v1`): add, read,
  read_range, clear_range, clear, and a list of about 3 MB that Weir answers
  in several pages (continuation tokens);
* state keyed by (key, window): one key in two fixed windows has two bags;
* a bundle that fails after writing state is retried without its writes
  being applied twice.
"""

import collections
from pathlib import Path

import pytest

from conftest import ENVIRONMENTS

SCRIPT = Path(__file__).resolve().with_name('pipelines_state.py')

# The input of most pipelines (pipelines_state.DATA), restated.
DATA = ([('a', v) for v in (5, 1, 4, 1)] + [('b', v) for v in (2, 7)] +
        [('many', v % 13) for v in range(300)])


def by_key(data):
  out = collections.defaultdict(list)
  for k, v in data:
    out[k].append(v)
  return out


def counts_seen(data):
  """'seen K i' for i in 1..n per key: a running count, in any order."""
  return collections.Counter(
      'seen %s %d' % (k, i) for k, vs in by_key(data).items()
      for i in range(1, len(vs) + 1))


def expected_value():
  lines = counts_seen(DATA)
  for k, vs in by_key(DATA).items():
    lines['final %s count=%d max=%d' % (k, len(vs), max(vs))] += 1
    lines['cleared %s count=None' % k] += 1
  return lines


def expected_bag():
  lines = counts_seen(DATA)
  for k, vs in by_key(DATA).items():
    lines['final %s %s' % (k, sorted(vs))] += 1
    lines['after clear %s [-1]' % k] += 1
  return lines


def expected_combining():
  lines = counts_seen(DATA)
  for k, vs in by_key(DATA).items():
    lines['final %s total=%d minmax=%s' % (k, sum(vs), (min(vs), max(vs)))] += 1
    lines['after clear %s total=0 minmax=None' % k] += 1
  return lines


def expected_set():
  lines = collections.Counter()
  for k, vs in by_key(DATA).items():
    for i, v in enumerate(vs):
      lines['seen %s %d %s' % (k, v, v in vs[:i])] += 1
    lines['final %s %s' % (k, sorted(set(vs)))] += 1
  return lines


def expected_ordered_list():
  a = [(s, 'a%d' % s) for s in (7, -3, 12, 0, 4, -8, 9, 5)] + [(4, 'a4-again')]
  b = [(1, 'b1'), (-20, 'b-20')]
  lines = counts_seen(
      [('a', 0)] * len(a) + [('b', 0)] * len(b) + [('big', 0)] * 3000)
  for key, items in (('a', a), ('b', b)):
    items = sorted(items)
    lines['all %s %s' % (key, items)] += 1
    lines['range [0,10) %s %s' % (key, [x for x in items if 0 <= x[0] < 10])] += 1
    kept = [x for x in items if not -5 <= x[0] < 5]
    lines['after clear_range [-5,5) %s %s' % (key, kept)] += 1
    lines['after add 2 %s %s' % (key, sorted(kept + [(2, 'late')]))] += 1
    lines['after clear %s []' % key] += 1
  big_keys = [(i * 7919) % 3001 - 1500 for i in range(3000)]
  lines['big: 3000 values, sorted=True, bytes=%d, first=%d last=%d' % (
      3000 * len('v0000-' + 'x' * 1000), min(big_keys), max(big_keys))] += 1
  return lines


def expected_windowed():
  # (key, value, timestamp seconds) in FixedWindows(10).
  data = [('a', 1, 1), ('a', 2, 3), ('a', 3, 9), ('a', 10, 10), ('a', 20, 15),
          ('b', 100, 12), ('b', 200, 19)]
  cells = collections.defaultdict(list)
  for k, v, t in data:
    cells[(k, t // 10 * 10)].append(v)
  lines = collections.Counter()
  for (k, start), vs in cells.items():
    w = '[Timestamp(%d), Timestamp(%d))' % (start, start + 10)
    for i in range(1, len(vs) + 1):
      lines['seen %s %s %d' % (k, w, i)] += 1
    lines['final %s %s count=%d %s' % (k, w, len(vs), sorted(vs))] += 1
  return lines


EXPECTED = {
    'state_value': expected_value,
    'state_bag': expected_bag,
    'state_combining': expected_combining,
    'state_set': expected_set,
    'state_ordered_list': expected_ordered_list,
    'state_windowed': expected_windowed,
}

_direct_cache = {}


def direct_output(beam, name):
  if name not in _direct_cache:
    run = beam.run_named(name, 'DIRECT', script=SCRIPT)
    assert run.returncode == 0, run.describe()
    files, lines = run.output()
    assert files and lines, run.describe()
    _direct_cache[name] = lines
  return _direct_cache[name]


def diff(expected, got):
  return 'missing: %s\n  unexpected: %s' % (
      dict(expected - got), dict(got - expected))


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_direct_runner_gives_the_expected_lines(beam, name):
  expected = EXPECTED[name]()
  lines = direct_output(beam, name)
  assert lines == expected, 'DirectRunner\n  ' + diff(expected, lines)


@pytest.mark.parametrize('env', ENVIRONMENTS)
@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_state_matches_direct_runner(beam, weir_server, name, env):
  expected = EXPECTED[name]()
  direct = direct_output(beam, name)
  run = beam.run_named(name, env, script=SCRIPT)
  assert run.returncode == 0, run.describe(weir_server)
  files, lines = run.output()
  assert files, 'no output files\n' + run.describe(weir_server)
  assert lines == direct, 'output differs from DirectRunner\n  ' + diff(direct, lines)
  assert lines == expected, diff(expected, lines)


@pytest.mark.parametrize('env', ENVIRONMENTS)
def test_retried_bundle_writes_state_once(beam, weir_server, env):
  run = beam.run_named('state_flaky', env, script=SCRIPT)
  assert run.returncode == 0, (
      'a bundle that fails once must be retried\n' + run.describe(weir_server))
  _, lines = run.output()
  expected = collections.Counter('seen r %d' % v for v in range(6))
  expected['final r [0, 1, 2, 3, 4, 5]'] += 1
  assert lines == expected, diff(expected, lines)
