"""Regressions Beam's own Python suites found on Weir (issue 9), one
pipeline of pipelines_regressions.py each, in the shape of the Beam test
that failed:

* a TestStream whose coder is not self-delimiting (StrUtf8Coder): its
  elements come in the coder's outer context and failed to decode at the
  stage's source (in streaming the bundle was retried until the client
  timed out);
* an event-time timer set at exactly the watermark stalled the job for good;
* Reshuffle: every element keeps its input's timestamp, window and pane;
* a processing-time trigger in batch fired once, at the end of the input,
  where Java's DirectRunner (and Beam's model) fire it on the wall clock;
* a Python processing-time timer's output carried the wall clock it fired
  at, not its element's event time (the timer's hold), as Prism gives;
* a side input from a GroupByKey with an early trigger, fed by a
  multi-output TestStream whose outputs advance their watermarks on their
  own, was seen empty by the main input (its elements arrived behind the
  other output's watermark and were dropped as late).

Each runs on Weir (LOOPBACK) and must give exactly EXPECTED; where Beam's
Python DirectRunner agrees it runs too and must give the same lines, and
DIRECT_DIFFERS says why it does not elsewhere.
"""

import collections
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().with_name('pipelines_regressions.py')

G = 'global'


def pane(timing, index, ontime, first, last):
  return '%s index=%d ontime=%d first=%s last=%s' % (timing, index, ontime, first, last)


NO_FIRING = pane('UNKNOWN', 0, 0, True, True)
ON_TIME_ONLY = pane('ON_TIME', 0, 0, True, True)


def session_lines(prefix, last):
  on_time = pane('ON_TIME', 0, 0, True, last)
  return [
      "%s (1, [1, 2]) [1.0, 4.0) @3.999 %s" % (prefix, on_time),
      "%s (1, [4]) [4.0, 6.0) @5.999 %s" % (prefix, on_time),
      "%s (2, [1, 2]) [1.0, 4.0) @3.999 %s" % (prefix, on_time),
      "%s (3, [1]) [1.0, 3.0) @2.999 %s" % (prefix, on_time),
  ]


def streaming_reshuffle_lines(prefix):
  return [
      "%s ('k', [1, 2]) [0.0, 10.0) @9.999 %s" % (prefix, pane('ON_TIME', 0, 0, True, False)),
      "%s ('k', [3]) [0.0, 10.0) @9.999 %s" % (prefix, pane('LATE', 1, 1, False, False)),
  ]


# (pipeline options for Weir and DirectRunner, expected lines)
EXPECTED = {
    # Elements of any length, the empty string too, decoded as strings.
    'test_stream_str_coder': (['--streaming'], [
        "str 'a:1' %s @1.000 %s" % (G, NO_FIRING),
        "str ':0' %s @2.000 %s" % (G, NO_FIRING),
        "str 'bcd:150' %s @6.000 %s" % (G, NO_FIRING),
    ]),
    # Beam's test_timer_output_timestamp: every timer fires, its output at
    # the timer's timestamp, the one at the watermark (10) too.
    'timer_at_watermark': (['--streaming'], [
        "fired 'timer1' %s @10.000 %s" % (G, NO_FIRING),
        "fired 'timer2' %s @20.000 %s" % (G, NO_FIRING),
        "fired 'timer3' %s @30.000 %s" % (G, NO_FIRING),
    ]),
    # Allowed lateness 100 s: the on-time pane is not the last; a late
    # pane follows. The reshuffled elements carry exactly those panes.
    'reshuffle_streaming_panes': (['--streaming'],
                                  streaming_reshuffle_lines('grouped') +
                                  streaming_reshuffle_lines('reshuffled')),
    # Batch, session windows, allowed lateness 0: the on-time pane of each
    # window is its only and last pane (Java's ReduceFnRunner and Beam's
    # PaneInfo.isLast: "the last pane that will be produced in the
    # window"); the reshuffled elements carry exactly that pane.
    'reshuffle_panes': ([], session_lines('grouped', True) + session_lines('reshuffled', True)),
    # The side input's [0, 5) window fires early with [100] and [5, 10)
    # with [400]; the main element of each window waits for its side window
    # and reads that firing (Weir serves a triggered side window's firings
    # as they come, see crates/engine/src/side_input.rs).
    'multi_triggered_side_input': (['--streaming'], [
        'main a1 [0.0, 5.0) @3.000 side=[100]',
        'main a2 [5.0, 10.0) @8.000 side=[400]',
    ]),
    # Batch, Repeatedly(AfterProcessingTime) (Java's
    # GroupByKeyTest.testAfterProcessingTimeContinuationTriggerUsingState):
    # while the upstream timer sleeps and holds the watermark below the end
    # of the global window, the first sum fires an early pane on the wall
    # clock and the second sum (its continuation trigger) fires it early too.
    'batch_processing_time_trigger': ([], [
        'first 42 %s @9223371950454.773 %s' % (G, pane('EARLY', 0, -1, True, False)),
        'second 42 %s @9223371950454.773 %s' % (G, pane('EARLY', 0, -1, True, False)),
    ]),
    # Each timer's output at its element's timestamp, in its window.
    'processing_time_timer_output': (['--streaming'], [
        "fired 'a:10' [0.0, 60.0) @10.000 %s" % NO_FIRING,
        "fired 'b:20' [0.0, 60.0) @20.000 %s" % NO_FIRING,
        "fired 'c:70' [60.0, 120.0) @70.000 %s" % NO_FIRING,
    ]),
}

DIRECT_DIFFERS = {
    'processing_time_timer_output':
        'ends without a line: no processing-time timer of this streaming '
        'run fires (Prism gives the lines Weir gives)',
    'batch_processing_time_trigger':
        'fails the pipeline: its batch trigger driver has no clock for a '
        'processing-time trigger (AttributeError: \'NoneType\' object has no '
        'attribute \'time\' in trigger.get_current_time)',
    'reshuffle_panes':
        'its batch GroupByKey marks no pane of a non-global window last '
        '(last=False, its trigger driver ends no DefaultTrigger), so Beam\'s '
        'test_reshuffle_windows_unchanged expects last=False; its Reshuffle '
        'keeps that pane as Weir\'s keeps last=True',
    'multi_triggered_side_input':
        'runs the main element only once its side window is complete and '
        'serves every pane of it ([0, 100] and [0, 400]: the early sum and '
        'the empty on-time sum); Weir serves the firing the main element '
        'waited for, as Beam\'s model documents ("the value from the latest '
        'trigger firing", Java\'s ViewTest.testTriggeredLatestSingleton)',
}


def diff(expected, got):
  return 'missing: %s\n  unexpected: %s' % (
      sorted((expected - got).elements()), sorted((got - expected).elements()))


def run_lines(beam, name, mode, server=None):
  options, _ = EXPECTED[name]
  run = beam.run_named(name, mode, extra=options, script=SCRIPT)
  assert run.returncode == 0, run.describe(server)
  _, lines = run.output()
  return lines


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_regression_on_weir(module_beam, weir_server, name):
  expected = collections.Counter(EXPECTED[name][1])
  lines = run_lines(module_beam, name, 'LOOPBACK', weir_server)
  assert lines == expected, diff(expected, lines)


@pytest.mark.parametrize('name', sorted(set(EXPECTED) - set(DIRECT_DIFFERS)))
def test_direct_runner_gives_the_same_lines(module_beam, name):
  expected = collections.Counter(EXPECTED[name][1])
  lines = run_lines(module_beam, name, 'DIRECT')
  assert lines == expected, 'DirectRunner\n  ' + diff(expected, lines)


def test_reshuffle_keeps_its_input_pane_on_both_runners(module_beam, weir_server):
  """Whatever pane the GroupByKey gives (the runners differ on is_last in
  batch), the reshuffled element carries the grouped element's."""
  for mode in ('LOOPBACK', 'DIRECT'):
    lines = run_lines(module_beam, 'reshuffle_panes', mode, weir_server)
    grouped = collections.Counter(
        l.split(' ', 1)[1] for l in lines.elements() if l.startswith('grouped '))
    reshuffled = collections.Counter(
        l.split(' ', 1)[1] for l in lines.elements() if l.startswith('reshuffled '))
    assert len(list(grouped.elements())) == 4, (mode, lines)
    assert reshuffled == grouped, (mode, diff(grouped, reshuffled))
