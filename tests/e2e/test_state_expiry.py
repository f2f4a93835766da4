"""User state is garbage-collected when its window expires, as in Beam's
StatefulDoFnRunner and Dataflow: once a stateful stage's input watermark
passes a window's max timestamp plus the allowed lateness (and the window's
end-of-window timers have run), its state is deleted for every key. The
global window's state lives until the job ends.

Each pipeline of pipelines_state_expiry.py runs on Weir (LOOPBACK, streaming
TestStream); its lines must be exactly those worked out here from the events
by Beam's model, and the job's user-state gauges (`weir jobs describe`, from
GetJobMetrics' weir:metric:user_state:* MonitoringInfos) must say how many
cells were live at the end and at the peak. The peak shows that windows were
collected while the job ran, not only at its end.
"""

import collections
import re
import uuid
from pathlib import Path

import pytest

from conftest import weir_jobs
from pipelines_state_expiry import EVENTS

SCRIPT = Path(__file__).resolve().with_name('pipelines_state_expiry.py')

# State ids of CountAndBuffer: a cell each per key and window.
STATE_IDS = 2
INF = float('inf')


def model(size, lateness):
  """(lines, live cells at the end, peak live cells) for EVENTS in fixed
  windows of `size` s (None: the global window) with `lateness` s.

  Beam's model: an element of an expired window (watermark past its max
  timestamp, end - 1 ms, plus the lateness) is dropped; an event-time timer
  fires once the watermark passes it (a timer set in the past fires at
  once); a window's state is deleted when it expires, but the global
  window's only when the job ends."""
  def window(t):
    return None if size is None else (t // size * size, t // size * size + size)

  def fmt(w):
    return 'global' if w is None else '[%s, %s)' % (float(w[0]), float(w[1]))

  def expired(w, wm):
    return w is not None and w[1] - 0.001 + lateness < wm

  def fires(w, wm):
    return wm == INF or (w is not None and w[1] - 0.001 < wm)

  state, timers, lines = {}, set(), collections.Counter()
  wm, peak = -INF, 0

  def fire():
    for cell in sorted(c for c in timers if fires(c[1], wm)):
      timers.discard(cell)
      values = state[cell]
      lines['flush %s %s count=%d %s' % (cell[0], fmt(cell[1]), len(values), sorted(values))] += 1
    for cell in [c for c in state if expired(c[1], wm)]:
      del state[cell]

  for ev in EVENTS:
    if ev[0] == 'e':
      for k, v, t in ev[1]:
        w = window(t)
        if expired(w, wm):
          continue
        state.setdefault((k, w), []).append(v)
        timers.add((k, w))
        lines['seen %s %s %d' % (k, fmt(w), len(state[(k, w)]))] += 1
      peak = max(peak, STATE_IDS * len(state))
    else:
      wm = INF if ev[0] == 'end' else ev[1]
    fire()
  live = STATE_IDS * sum(1 for (_, w) in state if w is None)
  return lines, live, peak


# name: (window size, lateness s, live cells at the end, peak live cells).
# The end and peak counts are stated here and checked against the model:
# fixed windows end with no state; without expiry the peak would be the 6
# (key, window) pairs' 12 cells. The global window keeps a, b and c's cells.
CASES = {
    'expiry_fixed': (10, 0, 0, 8),
    'expiry_fixed_lateness': (10, 5, 0, 10),
    'expiry_global': (None, 0, 6, 6),
}


def job_id_named(server, name):
  lines = weir_jobs(server, 'list').splitlines()
  header = lines[0].split('\t')
  rows = [dict(zip(header, l.split('\t'))) for l in lines[1:]]
  ids = [r['JOB_ID'] for r in rows if r['NAME'] == name]
  assert len(ids) == 1, (name, rows)
  return ids[0]


def diff(expected, got):
  return 'missing: %s\n  unexpected: %s' % (
      sorted((expected - got).elements()), sorted((got - expected).elements()))


def test_model_counts_match_the_stated_ones():
  for name, (size, lateness, live, peak) in CASES.items():
    _, model_live, model_peak = model(size, lateness)
    assert (model_live, model_peak) == (live, peak), name


def test_model_lines_for_fixed_windows():
  """The model's lines for the windowed pipelines, spelled out once: the
  end-of-window timer reads the state; with lateness the late value 11
  reaches the state of [0, 10) after its first flush and flushes again."""
  w0, w1, w2 = '[0.0, 10.0)', '[10.0, 20.0)', '[20.0, 30.0)'
  flushes = {
      'flush a %s count=2 [1, 2]' % w0,
      'flush b %s count=1 [3]' % w0,
      'flush a %s count=2 [4, 6]' % w1,
      'flush c %s count=2 [5, 8]' % w1,
      'flush b %s count=2 [7, 9]' % w2,
      'flush c %s count=1 [10]' % w2,
  }
  lines, _, _ = model(10, 0)
  assert {l for l in lines if l.startswith('flush')} == flushes
  lines, _, _ = model(10, 5)
  assert {l for l in lines if l.startswith('flush')} == flushes | {
      'flush a %s count=3 [1, 2, 11]' % w0}
  assert lines['seen a %s 3' % w0] == 1


@pytest.mark.parametrize('name', sorted(CASES))
def test_state_of_expired_windows_is_deleted(module_beam, weir_server, name):
  size, lateness, live, peak = CASES[name]
  job_name = '%s-%s' % (name.replace('_', '-'), uuid.uuid4().hex[:8])
  run = module_beam.run_named(
      name, 'LOOPBACK', extra=['--streaming', '--job_name=%s' % job_name],
      script=SCRIPT)
  assert run.returncode == 0, run.describe(weir_server)
  _, lines = run.output()
  expected, _, _ = model(size, lateness)
  assert lines == expected, diff(expected, lines)

  described = weir_jobs(weir_server, 'describe', job_id_named(weir_server, job_name))
  cells = re.search(r'user state: (\d+) live cell\(s\), peak (\d+)', described)
  assert cells, described
  assert (int(cells.group(1)), int(cells.group(2))) == (live, peak), described
