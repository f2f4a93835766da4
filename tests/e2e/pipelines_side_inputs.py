"""Side inputs in streaming, per window (test_side_inputs.py), runnable as a
script:

    python pipelines_side_inputs.py NAME --output PREFIX [--error_file PATH] [beam options...]

Same command line and exit codes as pipelines.py; the output is written by
pipelines_streaming.WriteLines (one file per bundle).

The TestStream pipelines replay one stream with two outputs, 'main' and
'side'; a ParDo over 'main' reads 'side' as a side input and writes one
line per main element: `ELEMENT SIDE_VALUE`. Watermark events advance both
outputs (Weir keeps one watermark per TestStream).
"""

import os
import sys
import time

import apache_beam as beam
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import trigger as tr
from apache_beam.transforms import window as bw
from apache_beam.transforms.periodicsequence import PeriodicImpulse

import pipelines
import pipelines_streaming

TAGS = ('main', 'side')


def _stream(events):
  """A TestStream with outputs 'main' and 'side' from a list of events:
  (tag, [(value, ts), ...]) elements, ('w', ts) watermark of both outputs,
  ('p', seconds) processing-time advance, ('end',) both watermarks to
  infinity."""
  s = TestStream(output_tags=TAGS)
  for ev in events:
    if ev[0] in TAGS:
      s = s.add_elements([bw.TimestampedValue(v, t) for v, t in ev[1]], tag=ev[0])
    elif ev[0] == 'w':
      for tag in TAGS:
        s = s.advance_watermark_to(ev[1], tag=tag)
    elif ev[0] == 'p':
      s = s.advance_processing_time(ev[1])
    elif ev[0] == 'end':
      for tag in TAGS:
        s = s.advance_watermark_to_infinity(tag=tag)
    else:
      raise ValueError(ev)
  return s


def _with_side(main, view):
  return main | 'WithSide' >> beam.Map(lambda x, s: '%s %s' % (x, s), view)


def side_after_main(p):
  """Fixed 10 s windows on both inputs; the side value of each window
  arrives after that window's main elements (and after the watermark moved
  past them), and the window completes (watermark past its end) only after
  that."""
  streams = p | 'Stream' >> _stream([
      ('main', [('a', 1), ('b', 2)]),
      ('w', 5),
      ('side', [(100, 5)]),
      ('w', 10),
      ('main', [('c', 12)]),
      ('w', 15),
      ('side', [(200, 13), (201, 14)]),
      ('w', 20),
      ('end',),
  ])
  main = streams['main'] | 'WindowMain' >> beam.WindowInto(bw.FixedWindows(10))
  side = streams['side'] | 'WindowSide' >> beam.WindowInto(bw.FixedWindows(10))
  return _with_side(main, beam.pvalue.AsList(side)) | 'Sort' >> beam.Map(_sorted_list)


def _sorted_list(line):
  element, values = line.split(' ', 1)
  return '%s %s' % (element, sorted(eval(values)))  # pylint: disable=eval-used


def side_per_window(p):
  """Fixed 10 s windows; one side value per window (AsSingleton), arriving
  before the main elements in [0, 10), after them in [10, 20) and in the
  same event as the watermark passing [20, 30)'s end."""
  streams = p | 'Stream' >> _stream([
      ('side', [(1, 1)]),
      ('main', [('a', 2)]),
      ('main', [('b', 11), ('c', 19)]),
      ('w', 10),
      ('side', [(2, 12)]),
      ('main', [('d', 25)]),
      ('w', 20),
      ('side', [(3, 21)]),
      ('main', [('e', 22)]),
      ('w', 30),
      ('end',),
  ])
  main = streams['main'] | 'WindowMain' >> beam.WindowInto(bw.FixedWindows(10))
  side = streams['side'] | 'WindowSide' >> beam.WindowInto(bw.FixedWindows(10))
  return _with_side(main, beam.pvalue.AsSingleton(side))


def _global_triggered(p, mode, combine):
  """A global-window side input, combined by `combine` under
  Repeatedly(AfterProcessingTime(5)) in accumulation `mode`, read as a
  singleton by main elements in the global window. Processing-time advances
  of 10 s fire the side panes between main elements."""
  streams = p | 'Stream' >> _stream([
      ('main', [('z', 0)]),
      ('side', [(3, 0)]),
      ('p', 10),
      ('main', [('a', 1)]),
      ('side', [(5, 1), (4, 1)]),
      ('p', 10),
      ('main', [('b', 2)]),
      ('side', [(7, 2)]),
      ('main', [('c', 3)]),
      ('p', 10),
      ('main', [('d', 4)]),
      ('end',),
  ])
  side = (
      streams['side']
      | 'WindowSide' >> beam.WindowInto(
          bw.GlobalWindows(),
          trigger=tr.Repeatedly(tr.AfterProcessingTime(5)),
          accumulation_mode=mode)
      | 'Combine' >> beam.CombineGlobally(combine).without_defaults())
  return _with_side(streams['main'], beam.pvalue.AsSingleton(side))


def global_triggered_discarding(p):
  """_global_triggered with DISCARDING panes of the maximum."""
  return _global_triggered(p, tr.AccumulationMode.DISCARDING, max)


def global_triggered_accumulating(p):
  """_global_triggered with ACCUMULATING panes of the sum."""
  return _global_triggered(p, tr.AccumulationMode.ACCUMULATING, sum)


def global_ungrouped_latest(p):
  """A global-window side input straight from the stream (no GroupByKey)
  under Repeatedly(AfterCount(1)), DISCARDING: each TestStream event is one
  firing and replaces the side input's value. z waits for the first value,
  which comes after the watermark moved past z."""
  streams = p | 'Stream' >> _stream([
      ('main', [('z', 0)]),
      ('w', 1),
      ('side', [('v1', 1)]),
      ('main', [('a', 1)]),
      ('side', [('v2', 2)]),
      ('main', [('b', 3), ('c', 3)]),
      ('side', [('v3', 4)]),
      ('main', [('d', 5)]),
      ('end',),
  ])
  side = streams['side'] | 'WindowSide' >> beam.WindowInto(
      bw.GlobalWindows(),
      trigger=tr.Repeatedly(tr.AfterCount(1)),
      accumulation_mode=tr.AccumulationMode.DISCARDING)
  return _with_side(streams['main'], beam.pvalue.AsSingleton(side))


# PeriodicImpulse: both impulses run SECONDS seconds from START (a multiple
# of WINDOW seconds a few seconds ahead, so every window is complete).
SECONDS = 6
WINDOW = 2
MAIN_INTERVAL = 0.5


def periodic_side_input(p):
  """The slowly-updating side input pattern: a PeriodicImpulse every
  second, in the global window under Repeatedly(AfterProcessingTime(0))
  (DISCARDING), is the side input (AsList) of a PeriodicImpulse every
  0.5 s in 2 s fixed windows. Lines: `main T sees [S...]` with T and S in
  seconds after START, and `window W count N` per main window."""
  start = (int(time.time()) // WINDOW + 3) * WINDOW
  stop = start + SECONDS
  side = (
      p
      | 'SideImpulse' >> PeriodicImpulse(
          start_timestamp=start, stop_timestamp=stop, fire_interval=1)
      | 'WindowSide' >> beam.WindowInto(
          bw.GlobalWindows(),
          trigger=tr.Repeatedly(tr.AfterProcessingTime(0)),
          accumulation_mode=tr.AccumulationMode.DISCARDING)
      | 'Relative' >> beam.Map(lambda t: int(round(t - start))))
  main = (
      p
      | 'MainImpulse' >> PeriodicImpulse(
          start_timestamp=start, stop_timestamp=stop, fire_interval=MAIN_INTERVAL)
      | 'WindowMain' >> beam.WindowInto(bw.FixedWindows(WINDOW)))
  seen = main | 'WithSide' >> beam.Map(
      lambda t, s: 'main %s sees %s' % (t - start, sorted(s)), beam.pvalue.AsList(side))
  counts = (
      main
      | 'One' >> beam.Map(lambda t: ('k', 1))
      | 'Count' >> beam.CombinePerKey(sum)
      | 'PerWindow' >> beam.ParDo(_PerWindow(start)))
  return (seen, counts) | 'All' >> beam.Flatten()


class _PerWindow(beam.DoFn):
  def __init__(self, start):
    self._start = start

  def process(self, kv, w=beam.DoFn.WindowParam):
    yield 'window %s count %d' % (int(w.start) - self._start, kv[1])


EXPIRING_WINDOWS = 30
EXPIRING_STRINGS = 3
EXPIRING_CHARS = 100000


def _expiring_events(strings):
  """EXPIRING_WINDOWS fixed 10 s windows of events: `strings` side
  elements, one main element, then the watermark past the window's end."""
  events = []
  for i in range(EXPIRING_WINDOWS):
    t = 10 * i
    events.append(('side', [(i, t + 1 + j) for j in range(strings)]))
    events.append(('main', [(i, t + 5)]))
    events.append(('w', t + 10))
  return events


def _big_side(side):
  """Each side element i as 'wi ' and EXPIRING_CHARS chars, in fixed 10 s
  windows."""
  return (
      side
      | 'Big' >> beam.Map(lambda i: 'w%d ' % i + 'x' * EXPIRING_CHARS)
      | 'WindowSide' >> beam.WindowInto(bw.FixedWindows(10)))


def side_windows_expire(p):
  """EXPIRING_WINDOWS fixed 10 s windows, each with EXPIRING_STRINGS side
  strings of EXPIRING_CHARS chars (AsList) and one main element that reads
  them; the watermark passes each window's end before the next window's
  data comes. One window's side data is about 300 KB, all of them 9 MB:
  under a side-input budget of 1 MiB the job finishes only if expired side
  windows are let go. Last, a main element (99) and a side element (98) of
  the first window come, long after it expired."""
  # Late data of the first window, long expired: dropped and ignored.
  late = [('main', [(99, 3)]), ('side', [(98, 4)])]
  streams = p | 'Stream' >> _stream(_expiring_events(EXPIRING_STRINGS) + late + [('end',)])
  main = streams['main'] | 'WindowMain' >> beam.WindowInto(bw.FixedWindows(10))
  return main | 'WithSide' >> beam.Map(
      lambda i, s: 'w%d: %d strings of w%s, %d chars' % (
          i, len(s), sorted(set(v.split(' ')[0][1:] for v in s)), sum(len(v) for v in s)),
      beam.pvalue.AsList(_big_side(streams['side'])))


STATEFUL_STRINGS = 2
# The main windows' allowed lateness, and how long after its window's end
# each window's timer fires (within it): timers of two later windows are
# always pending when a window's side data may go.
STATEFUL_LATENESS_S = 25
STATEFUL_TIMER_LAG_S = 20


class _SideSizeAtWindowEnd(beam.DoFn):
  """Stateful: keeps the side-input size each element saw and emits it from
  a timer STATEFUL_TIMER_LAG_S after the end of the element's window."""
  SEEN = beam.transforms.userstate.BagStateSpec('seen', beam.coders.StrUtf8Coder())
  END = beam.transforms.userstate.TimerSpec('end', beam.TimeDomain.WATERMARK)

  def process(self, kv, side, w=beam.DoFn.WindowParam,
              seen=beam.DoFn.StateParam(SEEN), end=beam.DoFn.TimerParam(END)):
    seen.add('w%d: %d strings, %d chars' % (kv[1], len(side), sum(len(v) for v in side)))
    end.set(w.max_timestamp() + STATEFUL_TIMER_LAG_S)

  @beam.transforms.userstate.on_timer(END)
  def at_end(self, seen=beam.DoFn.StateParam(SEEN)):
    for line in seen.read():
      yield 'timer ' + line
    seen.clear()


def stateful_side_windows_expire(p):
  """side_windows_expire's stream, STATEFUL_STRINGS strings a window (200
  KB), through a stateful DoFn with a timer after each window's end: timers
  of later windows are always pending, and each window's side data goes
  once its window expired and its own timer fired (at most 3 windows, 600
  KB, are kept at once)."""
  streams = p | 'Stream' >> _stream(_expiring_events(STATEFUL_STRINGS) + [('end',)])
  main = (
      streams['main']
      | 'WindowMain' >> beam.WindowInto(
          bw.FixedWindows(10), allowed_lateness=STATEFUL_LATENESS_S)
      | 'Key' >> beam.Map(lambda i: ('k', i)))
  return main | 'Stateful' >> beam.ParDo(
      _SideSizeAtWindowEnd(), beam.pvalue.AsList(_big_side(streams['side'])))


PIPELINES = {
    f.__name__: f
    for f in (side_after_main, side_per_window, global_triggered_discarding,
              global_triggered_accumulating, global_ungrouped_latest,
              periodic_side_input, side_windows_expire,
              stateful_side_windows_expire)
}


if __name__ == '__main__':
  # SDK workers of a PROCESS environment cannot import this directory's
  # modules: pickle pipelines_streaming's WriteLines by value.
  from apache_beam.internal.cloudpickle import cloudpickle
  cloudpickle.register_pickle_by_value(pipelines_streaming)
  pipelines.PIPELINES.update(PIPELINES)
  sys.exit(
      pipelines.main(
          sys.argv[1:],
          write=lambda output: beam.ParDo(
              pipelines_streaming.WriteLines(os.path.abspath(output)))))
