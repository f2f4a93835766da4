"""Side inputs in streaming, per window, on Weir (pipelines_side_inputs.py).

A main-input element in window W runs once the side window W maps to is
ready; side data arriving later updates the side input for later bundles;
a triggered DISCARDING or ACCUMULATING side input serves its latest firing
(Beam programming guide, "Side inputs and windowing"). The rule Weir uses is
documented in crates/engine/src/side_input.rs.

The expected lines are worked out from that model, not copied from a run.
Beam's Python DirectRunner (--streaming) runs the pipelines where it
agrees; DIRECT_DIFFERS says why it does not for the others.
"""

import collections
import re
from pathlib import Path

import pytest

from test_streaming import diff

SCRIPT = Path(__file__).resolve().with_name('pipelines_side_inputs.py')
STREAMING = ['--streaming', '--allow_unsafe_triggers']

EXPECTED = {
    # [0, 10): a and b arrive before the watermark moves to 5 and the side
    # value 100 comes; they wait until the watermark passes 10 and see [100]. [10, 20): c
    # waits until the watermark passes 20, by which both 200 and 201 are in.
    'side_after_main': ['a [100]', 'b [100]', 'c [200, 201]'],
    # One value per window: 1 came before a; b and c came before their
    # window's value 2 and wait for watermark 20; d (window [20, 30)) waits
    # for 3 and watermark 30, and e arrives after 3.
    'side_per_window': ['a 1', 'b 2', 'c 2', 'd 3', 'e 3'],
    # Side panes (max of the elements since the last pane) fire at each
    # processing-time advance: 3, then 5 (from 5 and 4), then 7. z waits
    # for the first pane; c runs after 7 arrived but before its pane fired.
    'global_triggered_discarding': ['z 3', 'a 3', 'b 5', 'c 5', 'd 7'],
    # The same with cumulative sums: 3, 12, 19; the latest pane is served.
    'global_triggered_accumulating': ['z 3', 'a 3', 'b 12', 'c 12', 'd 19'],
    # No GroupByKey: each TestStream event of the side output is one firing
    # and replaces the value; z waits for the first one.
    'global_ungrouped_latest': ['z v1', 'a v1', 'b v2', 'c v2', 'd v3'],
}

# Pipelines where Beam's Python DirectRunner (apache-beam 2.77, --streaming)
# does not give the lines above, and why.
DIRECT_DIFFERS = {
    'global_triggered_discarding':
        'keeps every pane of the side input, so the singleton view fails '
        '("PCollection of size 2 ... accessed as a singleton view") instead '
        "of serving the latest firing (the programming guide's rule)",
    'global_triggered_accumulating': 'keeps every pane (see above)',
    'global_ungrouped_latest': 'keeps every element (see above)',
}


def run_lines(beam, name, mode, server=None):
  run = beam.run_named(name, mode, extra=STREAMING, script=SCRIPT)
  assert run.returncode == 0, run.describe(server)
  _, lines = run.output()
  return lines


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_streaming_side_inputs_on_weir(module_beam, weir_server, name):
  expected = collections.Counter(EXPECTED[name])
  lines = run_lines(module_beam, name, 'LOOPBACK', weir_server)
  assert lines == expected, diff(expected, lines)


def test_streaming_side_inputs_process_environment(module_beam, weir_server):
  name = 'global_triggered_discarding'
  expected = collections.Counter(EXPECTED[name])
  lines = run_lines(module_beam, name, 'PROCESS', weir_server)
  assert lines == expected, diff(expected, lines)


@pytest.mark.parametrize('name', sorted(set(EXPECTED) - set(DIRECT_DIFFERS)))
def test_direct_runner_gives_the_same_lines(module_beam, name):
  expected = collections.Counter(EXPECTED[name])
  lines = run_lines(module_beam, name, 'DIRECT')
  assert lines == expected, 'DirectRunner\n  ' + diff(expected, lines)


def test_periodic_impulse_side_input_updates_and_finishes(module_beam, weir_server):
  """The slowly-updating side input pattern ends (bounded impulses), every
  main element saw a value the side impulse produced (seconds 0..5 after
  the start), and the main elements counted per 2 s window are exact."""
  lines = run_lines(module_beam, 'periodic_side_input', 'LOOPBACK', weir_server)
  counts = collections.Counter(l for l in lines.elements() if l.startswith('window '))
  assert counts == collections.Counter(
      ['window 0 count 4', 'window 2 count 4', 'window 4 count 4']), lines
  seen = {}
  for line in lines.elements():
    if line.startswith('window '):
      continue
    m = re.fullmatch(r'main (\d+\.\d) sees \[([\d, ]*)\]', line)
    assert m, line
    seen[float(m.group(1))] = [int(v) for v in m.group(2).split(', ') if v]
  assert sorted(seen) == [i / 2 for i in range(12)], lines
  for t, values in seen.items():
    assert values and set(values) <= set(range(6)), (t, values)
