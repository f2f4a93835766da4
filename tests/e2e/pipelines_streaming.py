"""Trigger, late-data and streaming-timer pipelines for Weir's end-to-end
tests (test_streaming.py), runnable as a script:

    python pipelines_streaming.py NAME --output PREFIX [--error_file PATH] [beam options...]

Same command line and exit codes as pipelines.py.

Most pipelines replay a TestStream (elements with event timestamps in
seconds, watermark advances, processing-time advances), window it with one
trigger, group by key and write one line per pane:

    KEY [sorted values] TIMING index=I ontime=J first=B last=B WINDOW @TIMESTAMP

TIMING is EARLY, ON_TIME or LATE (Beam's PaneInfo timing), ontime the
pane's on-time index (-1 for early panes is not asserted: Python reports
what the runner sent), WINDOW `[start, end)` in seconds or `global`, and
TIMESTAMP the output timestamp of the pane in seconds (omitted in the
global window, whose end Python and Java encode differently).

The output is written by a DoFn (`WriteLines`), one file per bundle named
PREFIX-<uuid>-of-stream, because WriteToText in streaming needs windowed
file naming; the tests read all files back as a multiset of lines.
"""

import os
import sys
import uuid

import apache_beam as beam
from apache_beam.coders import StrUtf8Coder
from apache_beam.coders import TupleCoder
from apache_beam.coders import VarIntCoder
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import trigger as tr
from apache_beam.transforms import userstate
from apache_beam.transforms import window as bw
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import Duration
from apache_beam.utils.timestamp import Timestamp

import pipelines

ACC = tr.AccumulationMode.ACCUMULATING
DIS = tr.AccumulationMode.DISCARDING
TIMING = {0: 'EARLY', 1: 'ON_TIME', 2: 'LATE', 3: 'UNKNOWN'}
KV_CODER = TupleCoder((StrUtf8Coder(), VarIntCoder()))


class WriteLines(beam.DoFn):
  """Appends each string element to a file of its own bundle under the
  --output prefix (files PREFIX-<uuid>-of-stream)."""
  def __init__(self, prefix):
    self._prefix = prefix

  def start_bundle(self):
    self._lines = []

  def process(self, line):
    self._lines.append(line)

  def finish_bundle(self):
    if self._lines:
      name = '%s-%s-of-stream' % (self._prefix, uuid.uuid4().hex)
      with open(name, 'w', encoding='utf-8') as f:
        f.write(''.join(l + '\n' for l in self._lines))
      self._lines = []


def millis(ts):
  """A timestamp in seconds with millisecond precision (the Runner API's;
  Python's own runners keep microseconds, so 9.999999 prints as 9.999)."""
  return '%.3f' % (ts.micros // 1000 / 1000.0)


def fmt_window(w):
  if isinstance(w, bw.GlobalWindow):
    return 'global'
  return '[%s, %s)' % (float(w.start), float(w.end))


class FormatPane(beam.DoFn):
  """One line per GroupByKey output: its key, values and pane."""
  def process(
      self,
      kv,
      w=beam.DoFn.WindowParam,
      pane=beam.DoFn.PaneInfoParam,
      ts=beam.DoFn.TimestampParam):
    k, vs = kv
    line = '%s %s %s index=%d ontime=%d first=%s last=%s %s' % (
        k, sorted(vs), TIMING.get(pane.timing, pane.timing), pane.index,
        pane.nonspeculative_index, pane.is_first, pane.is_last, fmt_window(w))
    if not isinstance(w, bw.GlobalWindow):
      line += ' @%s' % millis(ts)
    yield line


def _stream(events):
  """A TestStream of KVs from a list of events:
  ('e', [(key, value, ts), ...]) elements, ('w', ts) watermark,
  ('p', seconds) processing-time advance, ('end',) watermark to infinity."""
  s = TestStream(coder=KV_CODER)
  for ev in events:
    if ev[0] == 'e':
      s = s.add_elements(
          [bw.TimestampedValue((k, v), t) for k, v, t in ev[1]])
    elif ev[0] == 'w':
      s = s.advance_watermark_to(ev[1])
    elif ev[0] == 'p':
      s = s.advance_processing_time(ev[1])
    elif ev[0] == 'end':
      s = s.advance_watermark_to_infinity()
    else:
      raise ValueError(ev)
  return s


def _panes(p, events, windowfn, trigger, mode, lateness=0):
  return (
      p
      | 'Stream' >> _stream(events)
      | 'Window' >> beam.WindowInto(
          windowfn,
          trigger=trigger,
          accumulation_mode=mode,
          allowed_lateness=lateness)
      | 'Group' >> beam.GroupByKey()
      | 'Panes' >> beam.ParDo(FormatPane()))


F10 = bw.FixedWindows(10)

# --- Streaming pipelines, one trigger each ------------------------------------


def default_late(p):
  """Default trigger, allowed lateness 20 s: an on-time pane, a late pane
  per late element within the lateness, an element past it dropped."""
  return _panes(p, [
      ('e', [('k', 1, 1), ('k', 2, 2)]),
      ('w', 10),
      ('e', [('k', 3, 3)]),   # late, within lateness: a LATE pane
      ('e', [('k', 4, 4)]),   # another LATE pane
      ('w', 30),              # window [0, 10) expires (9.999 + 20 < 30)
      ('e', [('k', 5, 5)]),   # dropped
      ('e', [('k', 6, 15)]),  # [10, 20) is late but not expired: a LATE pane
      ('end',),
  ], F10, tr.DefaultTrigger(), DIS, lateness=20)


def default_no_lateness(p):
  """Default trigger, no allowed lateness: late data is dropped."""
  return _panes(p, [
      ('e', [('k', 1, 1), ('j', 2, 2), ('k', 3, 12)]),
      ('w', 10),
      ('e', [('k', 4, 4), ('k', 5, 15)]),  # 4 dropped, 5 on time in [10, 20)
      ('end',),
  ], F10, tr.DefaultTrigger(), DIS)


def _early_late_events():
  return [
      ('e', [('k', 1, 1), ('k', 2, 2)]),
      ('e', [('k', 3, 3)]),
      ('w', 10),
      ('e', [('k', 4, 4)]),
      ('e', [('k', 5, 5)]),
      ('w', 100),
      ('e', [('k', 6, 6)]),  # past the lateness: dropped
      ('end',),
  ]


def watermark_early_late_acc(p):
  """AfterWatermark(early=AfterCount(2), late=AfterCount(1)), accumulating."""
  return _panes(p, _early_late_events(), F10,
                tr.AfterWatermark(early=tr.AfterCount(2), late=tr.AfterCount(1)),
                ACC, lateness=50)


def watermark_early_late_dis(p):
  """AfterWatermark(early=AfterCount(2), late=AfterCount(1)), discarding."""
  return _panes(p, _early_late_events(), F10,
                tr.AfterWatermark(early=tr.AfterCount(2), late=tr.AfterCount(1)),
                DIS, lateness=50)


def watermark_early_processing_time(p):
  """AfterWatermark(early=AfterProcessingTime(5)): early panes on the
  TestStream's processing-time clock."""
  return _panes(p, [
      ('e', [('k', 1, 1)]),
      ('p', 3),
      ('e', [('k', 2, 2)]),
      ('p', 3),               # 6 s after the first element: early pane
      ('e', [('k', 3, 3)]),
      ('p', 10),              # early pane
      ('p', 10),              # nothing new: no pane
      ('w', 10),              # on-time pane (nothing new since)
      ('end',),
  ], F10, tr.AfterWatermark(early=tr.AfterProcessingTime(5)), DIS)


def _one_by_one(values):
  """One TestStream element event per value (so a count trigger sees each
  element on its own, whatever the runner's bundling)."""
  return [('e', [('k', v, v)]) for v in values]


def after_count(p):
  """A bare AfterCount(3) in fixed windows (Beam's own
  test_after_count_trigger_streaming shape, on a TestStream)."""
  return _panes(p, _one_by_one((1, 2, 3, 4, 5)) + [
      ('e', [('j', 6, 6), ('j', 7, 7)]),
      ('w', 10),
      ('end',),
  ], F10, tr.AfterCount(3), DIS)


def repeatedly_count_acc(p):
  """Repeatedly(AfterCount(2)) in the global window, accumulating."""
  return _panes(p, _one_by_one(range(1, 6)) + [('end',)],
                bw.GlobalWindows(), tr.Repeatedly(tr.AfterCount(2)), ACC)


def repeatedly_count_dis(p):
  """Repeatedly(AfterCount(2)) in the global window, discarding."""
  return _panes(p, _one_by_one(range(1, 6)) + [('end',)],
                bw.GlobalWindows(), tr.Repeatedly(tr.AfterCount(2)), DIS)


def repeatedly_processing_time(p):
  """Repeatedly(AfterProcessingTime(10)) in the global window."""
  return _panes(p, [
      ('e', [('k', 1, 1)]),
      ('p', 5),
      ('e', [('k', 2, 2)]),
      ('p', 6),               # 11 s after the first element: pane [1, 2]
      ('e', [('k', 3, 3)]),
      ('p', 20),              # pane [3]
      ('e', [('k', 4, 4)]),
      ('end',),               # the end of input: final pane [4]
  ], bw.GlobalWindows(), tr.Repeatedly(tr.AfterProcessingTime(10)), DIS)


def synchronized_processing_time(p):
  """Repeatedly(AfterSynchronizedProcessingTime()) in fixed windows."""
  return _panes(p, [
      ('e', [('k', 1, 1)]),
      ('p', 1),
      ('e', [('k', 2, 2)]),
      ('p', 1),
      ('w', 10),
      ('end',),
  ], F10, tr.Repeatedly(tr._AfterSynchronizedProcessingTime()), DIS)


def after_each(p):
  """Repeatedly(AfterEach(AfterCount(2), AfterCount(3))) in the global window."""
  return _panes(p, _one_by_one(range(1, 12)) + [('end',)],
                bw.GlobalWindows(),
                tr.Repeatedly(tr.AfterEach(tr.AfterCount(2), tr.AfterCount(3))),
                DIS)


def after_any(p):
  """Repeatedly(AfterAny(AfterCount(3), AfterProcessingTime(10)))."""
  return _panes(p, [
      ('e', [('k', 1, 1), ('k', 2, 2), ('k', 3, 3)]),  # count: pane [1, 2, 3]
      ('e', [('k', 4, 4)]),
      ('p', 11),                                       # time: pane [4]
      ('e', [('k', 5, 5), ('k', 6, 6)]),
      ('p', 11),                                       # time: pane [5, 6]
      ('end',),
  ], bw.GlobalWindows(),
                tr.Repeatedly(tr.AfterAny(tr.AfterCount(3), tr.AfterProcessingTime(10))),
                DIS)


def after_all(p):
  """Repeatedly(AfterAll(AfterCount(2), AfterProcessingTime(10)))."""
  return _panes(p, [
      ('e', [('k', 1, 1)]),
      ('p', 11),              # time done, count not: no pane
      ('e', [('k', 2, 2)]),   # both done: pane [1, 2]
      ('e', [('k', 3, 3), ('k', 4, 4), ('k', 5, 5)]),  # count done, time not
      ('p', 11),              # both done: pane [3, 4, 5]
      ('e', [('k', 6, 6)]),
      ('end',),               # final pane [6]
  ], bw.GlobalWindows(),
                tr.Repeatedly(tr.AfterAll(tr.AfterCount(2), tr.AfterProcessingTime(10))),
                DIS)


def or_finally(p):
  """Repeatedly(AfterCount(2)).orFinally(AfterCount(5)) in fixed windows,
  with allowed lateness: once the finally fires, the window is closed."""
  return _panes(p, _one_by_one(range(1, 8)) + [
      ('w', 10),
      ('e', [('k', 8, 8)]),
      ('end',),
  ], F10, tr.OrFinally(tr.Repeatedly(tr.AfterCount(2)), tr.AfterCount(5)),
                DIS, lateness=100)


def never(p):
  """Never in fixed windows, no allowed lateness: one pane per window when
  it expires, late data dropped."""
  return _panes(p, [
      ('e', [('k', 1, 1), ('k', 2, 2)]),
      ('e', [('k', 3, 12)]),
      ('w', 10),              # [0, 10) expires: its only pane
      ('e', [('k', 4, 4)]),   # late: dropped
      ('e', [('k', 5, 15)]),
      ('end',),
  ], F10, tr._Never(), DIS)


def always(p):
  """Repeatedly(Always()) in fixed windows: a pane per element."""
  return _panes(p, [
      ('e', [('k', 1, 1)]),
      ('e', [('k', 2, 2)]),
      ('w', 10),
      ('e', [('k', 3, 3)]),   # late, within lateness
      ('end',),
  ], F10, tr.Repeatedly(tr.Always()), ACC, lateness=10)


def sliding_early(p):
  """SlidingWindows(10, 5) with AfterWatermark(early=AfterCount(2)), accumulating."""
  return _panes(p, [
      ('e', [('k', 1, 1), ('k', 6, 6)]),  # 1 in [-5,5),[0,10); 6 in [0,10),[5,15)
      ('w', 5),                           # [-5, 5) on time
      ('e', [('k', 7, 7)]),
      ('w', 20),
      ('end',),
  ], bw.SlidingWindows(10, 5),
                tr.AfterWatermark(early=tr.AfterCount(2)), ACC)


def sessions_early(p):
  """Sessions(5) with AfterWatermark(early=AfterCount(2)), accumulating:
  two sessions that a later element merges."""
  return _panes(p, [
      ('e', [('k', 1, 1), ('k', 2, 3)]),  # session [1, 8): early pane [1, 2]
      ('e', [('k', 3, 10)]),              # session [10, 15)
      ('e', [('k', 4, 7)]),               # merges them: [1, 15)
      ('w', 20),
      ('end',),
  ], bw.Sessions(5), tr.AfterWatermark(early=tr.AfterCount(2)), ACC)


def sessions_late(p):
  """Sessions(5), Default trigger, lateness 10: a late element merging
  into an already fired session, and one past the lateness."""
  return _panes(p, [
      ('e', [('k', 1, 1), ('k', 2, 3)]),  # session [1, 8)
      ('w', 9),                           # on time
      ('e', [('k', 3, 6)]),               # late: session [1, 11)
      ('w', 30),
      ('e', [('k', 4, 2)]),               # past the lateness: dropped
      ('end',),
  ], bw.Sessions(5), tr.DefaultTrigger(), DIS, lateness=10)


def custom_merging_early(p):
  """A custom merging WindowFn (pipelines.DecadeWindows: [t, t + 1) windows
  of one decade merge) with AfterWatermark(early=AfterCount(2)),
  accumulating: the SDK merges windows as they arrive."""
  return _panes(p, [
      ('e', [('k', 1, 1), ('k', 2, 3)]),  # [1, 2) + [3, 4) -> [1, 4): early pane
      ('e', [('k', 3, 12)]),              # [12, 13), alone
      ('e', [('k', 4, 7)]),               # merges into [1, 8)
      ('w', 20),
      ('end',),
  ], pipelines.DecadeWindows(), tr.AfterWatermark(early=tr.AfterCount(2)), ACC)


def custom_merging_late(p):
  """DecadeWindows, Default trigger, lateness 10: a late element merging
  into an already fired window, and one past the lateness."""
  return _panes(p, [
      ('e', [('k', 1, 1), ('k', 2, 3)]),  # [1, 4)
      ('w', 5),                           # on time
      ('e', [('k', 3, 8)]),               # late for [1, 4), but [8, 9) is not: [1, 9)
      ('w', 30),
      ('e', [('k', 4, 2)]),               # past the lateness: dropped
      ('end',),
  ], pipelines.DecadeWindows(), tr.DefaultTrigger(), DIS, lateness=10)


# --- Streaming stateful DoFn with timers --------------------------------------


class BufferWithTimers(beam.DoFn):
  """Buffers values per key and window in a bag. An event-time timer at
  the end of the window flushes the bag; with `processing_time`, so does a
  processing-time timer armed once per key and window, 100 s of processing
  time after its first element.

  A Python DoFn can only read the wall clock, so the timer is set at
  wall-clock now + 100 s: on Weir the TestStream's clock starts at the wall
  clock's time when the job starts, so advancing it by 150 s fires the
  timer (as long as the job takes under 50 s to get there)."""
  BAG = userstate.BagStateSpec('bag', VarIntCoder())
  ARMED = userstate.ReadModifyWriteStateSpec('armed', VarIntCoder())
  EVENT = userstate.TimerSpec('event', TimeDomain.WATERMARK)
  PROC = userstate.TimerSpec('proc', TimeDomain.REAL_TIME)

  def __init__(self, processing_time):
    self._processing_time = processing_time

  def process(
      self,
      kv,
      w=beam.DoFn.WindowParam,
      bag=beam.DoFn.StateParam(BAG),
      armed=beam.DoFn.StateParam(ARMED),
      event=beam.DoFn.TimerParam(EVENT),
      proc=beam.DoFn.TimerParam(PROC)):
    bag.add(kv[1])
    event.set(w.max_timestamp())
    if self._processing_time and not armed.read():
      armed.write(1)
      proc.set(Timestamp.now() + Duration(seconds=100))

  @userstate.on_timer(EVENT)
  def on_event(
      self,
      key=beam.DoFn.KeyParam,
      w=beam.DoFn.WindowParam,
      ts=beam.DoFn.TimestampParam,
      bag=beam.DoFn.StateParam(BAG)):
    yield 'event %s %s %s @%s' % (key, sorted(bag.read()), fmt_window(w), millis(ts))
    bag.clear()

  @userstate.on_timer(PROC)
  def on_proc(
      self,
      key=beam.DoFn.KeyParam,
      w=beam.DoFn.WindowParam,
      bag=beam.DoFn.StateParam(BAG)):
    yield 'proc %s %s %s' % (key, sorted(bag.read()), fmt_window(w))
    bag.clear()


def _timers(p, processing_time, late):
  events = [
      ('e', [('k', 1, 1), ('k', 2, 2), ('j', 7, 3), ('k', 5, 15)]),
      ('p', 150),             # processing-time timers of the three cells
      ('e', [('k', 3, 4), ('k', 6, 16)]),
      ('w', 10),              # event-time timers of [0, 10)
  ]
  if late:
    # Late for [0, 10) (no allowed lateness): a stateful DoFn drops it.
    events.append(('e', [('k', 8, 8)]))
  events.append(('end',))     # event-time timer of [10, 20)
  return (
      p
      | 'Stream' >> _stream(events)
      | 'Window' >> beam.WindowInto(F10)
      | 'Buffer' >> beam.ParDo(BufferWithTimers(processing_time)))


def timers_event(p):
  """A stateful DoFn with an event-time timer under a TestStream."""
  return _timers(p, False, False)


def timers_processing(p):
  """A stateful DoFn with event-time and processing-time timers under a
  TestStream."""
  return _timers(p, True, False)


def stateful_late(p):
  """timers_event plus an element for an expired window, which a stateful
  DoFn must drop."""
  return _timers(p, False, True)


# --- Batch: every trigger fires one pane per window ---------------------------


# Triggers for the batch pipelines. Every window of the input holds at least
# two elements, so that AfterCount(2) is met in each.
BATCH_TRIGGERS = {
    'default': tr.DefaultTrigger(),
    'early_late': tr.AfterWatermark(early=tr.AfterCount(1), late=tr.AfterCount(1)),
    'count': tr.AfterCount(2),
    'repeat_count': tr.Repeatedly(tr.AfterCount(1)),
    'after_each': tr.AfterEach(tr.AfterCount(1), tr.AfterCount(2)),
    'or_finally': tr.OrFinally(tr.Repeatedly(tr.AfterCount(1)), tr.AfterCount(3)),
    'never': tr._Never(),
    'always': tr.Repeatedly(tr.Always()),
}

# Processing-time triggers in batch (Beam's Python DirectRunner fails on
# these in batch: its trigger context has no clock).
BATCH_PROCESSING_TIME_TRIGGERS = {
    'processing_time': tr.AfterProcessingTime(60),
    'after_any': tr.AfterAny(tr.AfterCount(2), tr.AfterProcessingTime(60)),
    'after_all': tr.AfterAll(tr.AfterCount(2), tr.AfterProcessingTime(60)),
    'synchronized': tr.Repeatedly(tr._AfterSynchronizedProcessingTime()),
}

# (key, value, timestamp seconds): windows [0, 10) and [10, 20) and [20, 30)
# for k, [0, 10) for j.
BATCH_DATA = [('k', v, t) for v, t in ((1, 1), (2, 2), (3, 3), (4, 4), (5, 12),
                                       (6, 13), (7, 25), (8, 27))
             ] + [('j', 9, 7), ('j', 10, 8)]


def _batch_triggers(p, triggers):
  """Every trigger of `triggers` on BATCH_DATA (no TestStream, no
  --streaming), each line prefixed with the trigger's name."""
  stamped = (
      p
      | 'Create' >> beam.Create(BATCH_DATA)
      | 'Stamp' >> beam.Map(lambda e: bw.TimestampedValue((e[0], e[1]), e[2])))
  outs = []
  for name, trigger in sorted(triggers.items()):
    outs.append(
        stamped
        | 'Window ' + name >> beam.WindowInto(
            F10, trigger=trigger, accumulation_mode=DIS)
        | 'Group ' + name >> beam.GroupByKey()
        | 'Panes ' + name >> beam.ParDo(FormatPane())
        | 'Tag ' + name >> beam.Map(lambda line, n=name: '%s: %s' % (n, line)))
  return outs | 'All' >> beam.Flatten()


def batch_triggers(p):
  return _batch_triggers(p, BATCH_TRIGGERS)


def batch_processing_time_triggers(p):
  return _batch_triggers(p, BATCH_PROCESSING_TIME_TRIGGERS)


# --- An unbounded source that starts empty -----------------------------------


def late_start_impulse(p):
  """PeriodicImpulse that starts firing 3 s after the job is built (its
  source is empty until then) and fires 4 times, 1 s apart, counted in
  2-second fixed windows: `[start, end) count` lines. The first firing
  time S (seconds since the epoch) is written to PREFIX.start."""
  import time as _time
  from apache_beam.transforms.periodicsequence import PeriodicImpulse
  start = int(_time.time()) + 3
  with open(pipelines.FLAGS.output + '.start', 'w') as f:
    f.write(str(start))
  return (
      p
      | PeriodicImpulse(start_timestamp=start, stop_timestamp=start + 4, fire_interval=1)
      | 'Key' >> beam.Map(lambda t: ('n', 1))
      | 'Fixed2' >> beam.WindowInto(bw.FixedWindows(2))
      | 'Count' >> beam.CombinePerKey(sum)
      | 'Format' >> beam.ParDo(FormatCount()))


def fast_impulse(p):
  """PeriodicImpulse firing every 1 ms for 2 s (2000 elements), each
  written as its fire time in microseconds by the script's WriteLines,
  fused into the source's stage: one file per bundle of that stage that
  emitted any."""
  import time as _time
  from apache_beam.transforms.periodicsequence import PeriodicImpulse
  start = _time.time() + 1

  def micros(t):
    return str(t.micros if isinstance(t, Timestamp) else int(round(t * 1e6)))

  return (
      p
      | PeriodicImpulse(start_timestamp=start, stop_timestamp=start + 2, fire_interval=0.001)
      | 'Micros' >> beam.Map(micros))


class FormatCount(beam.DoFn):
  def process(self, kv, w=beam.DoFn.WindowParam):
    yield '%s %d' % (fmt_window(w), kv[1])


STREAMING = (default_late, default_no_lateness, watermark_early_late_acc,
             watermark_early_late_dis, watermark_early_processing_time,
             after_count, repeatedly_count_acc, repeatedly_count_dis,
             repeatedly_processing_time, synchronized_processing_time,
             after_each, after_any, after_all, or_finally, never, always,
             sliding_early, sessions_early, sessions_late, custom_merging_early,
             custom_merging_late, timers_event,
             timers_processing, stateful_late, batch_triggers,
             batch_processing_time_triggers, late_start_impulse, fast_impulse)

PIPELINES = {f.__name__: f for f in STREAMING}


if __name__ == '__main__':
  pipelines.PIPELINES.update(PIPELINES)
  sys.exit(
      pipelines.main(
          sys.argv[1:],
          write=lambda output: beam.ParDo(WriteLines(os.path.abspath(output)))))
