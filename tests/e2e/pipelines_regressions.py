"""Pipelines for the regressions Beam's own Python suites found on Weir
(test_regressions.py), runnable as a script:

    python pipelines_regressions.py NAME --output PREFIX [--error_file PATH] [beam options...]

Same command line and exit codes as pipelines.py. Each pipeline is the
shape of one Beam test that failed on Weir, and writes one line per
element it checks (value, timestamp, window, pane), through the same
per-bundle file writer as pipelines_streaming.py.
"""

import os
import sys

import apache_beam as beam
from apache_beam.coders import StrUtf8Coder
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import trigger as tr
from apache_beam.transforms import userstate
from apache_beam.transforms import window as bw
from apache_beam.transforms.timeutil import TimeDomain

import pipelines
from pipelines_streaming import WriteLines
from pipelines_streaming import fmt_window
from pipelines_streaming import millis

TIMING = {0: 'EARLY', 1: 'ON_TIME', 2: 'LATE', 3: 'UNKNOWN'}


def fmt_pane(pane):
  return '%s index=%d ontime=%d first=%s last=%s' % (
      TIMING.get(pane.timing, pane.timing), pane.index,
      pane.nonspeculative_index, pane.is_first, pane.is_last)


class FormatElement(beam.DoFn):
  """`PREFIX VALUE WINDOW @TIMESTAMP PANE` for every element."""
  def __init__(self, prefix):
    self._prefix = prefix

  def process(
      self,
      e,
      w=beam.DoFn.WindowParam,
      ts=beam.DoFn.TimestampParam,
      pane=beam.DoFn.PaneInfoParam):
    yield '%s %r %s @%s %s' % (
        self._prefix, e, fmt_window(w), millis(ts), fmt_pane(pane))


# --- TestStream with a coder that is not self-delimiting ----------------------


def test_stream_str_coder(p):
  """TestStream(coder=StrUtf8Coder()) (Beam's test_stream_test shape): its
  elements are encoded in the coder's outer context (no length), which the
  runner must send length-prefixed."""
  stream = (
      TestStream(coder=StrUtf8Coder())
      .add_elements([bw.TimestampedValue('a', 1), bw.TimestampedValue('', 2)])
      .advance_watermark_to(5)
      .add_elements([bw.TimestampedValue('bcd' * 50, 6)])
      .advance_watermark_to_infinity())
  return (
      p
      | stream
      | 'Length' >> beam.Map(lambda s: '%s:%d' % (s[:3], len(s)))
      | beam.ParDo(FormatElement('str')))


# --- An event-time timer set at exactly the watermark ------------------------


class TimersAtAndAfterTheWatermark(beam.DoFn):
  """Beam's userstate_test.test_timer_output_timestamp: the watermark is at
  10 when the element comes; timers at 10 (the watermark itself), 20, 30."""
  T1 = userstate.TimerSpec('t1', TimeDomain.WATERMARK)
  T2 = userstate.TimerSpec('t2', TimeDomain.WATERMARK)
  T3 = userstate.TimerSpec('t3', TimeDomain.WATERMARK)

  def process(
      self,
      element,
      t1=beam.DoFn.TimerParam(T1),
      t2=beam.DoFn.TimerParam(T2),
      t3=beam.DoFn.TimerParam(T3)):
    t1.set(10)
    t2.set(20)
    t3.set(30)

  @userstate.on_timer(T1)
  def on_t1(self):
    yield 'timer1'

  @userstate.on_timer(T2)
  def on_t2(self):
    yield 'timer2'

  @userstate.on_timer(T3)
  def on_t3(self):
    yield 'timer3'


def timer_at_watermark(p):
  return (
      p
      | TestStream().advance_watermark_to(10).add_elements([1])
      | 'Key' >> beam.Map(lambda x: ('k', x))
      | beam.ParDo(TimersAtAndAfterTheWatermark())
      | beam.ParDo(FormatElement('fired')))


# --- Reshuffle keeps the pane of its input -----------------------------------


def reshuffle_panes(p):
  """Beam's util_test.test_reshuffle_windows_unchanged: session windows,
  grouped (batch), then reshuffled; both keep their window, timestamp and
  pane."""
  data = [(1, 1), (2, 1), (3, 1), (1, 2), (2, 2), (1, 4)]
  grouped = (
      p
      | beam.Create(data)
      | 'Stamp' >> beam.Map(lambda v: bw.TimestampedValue(v, v[1]))
      | 'Sessions' >> beam.WindowInto(bw.Sessions(gap_size=2))
      | beam.GroupByKey()
      | 'Sort' >> beam.MapTuple(lambda k, vs: (k, sorted(vs))))
  before = grouped | 'Before' >> beam.ParDo(FormatElement('grouped'))
  after = (
      grouped
      | beam.Reshuffle()
      | 'After' >> beam.ParDo(FormatElement('reshuffled')))
  return (before, after) | beam.Flatten()


def reshuffle_streaming_panes(p):
  """A TestStream grouped in fixed windows with allowed lateness (so the
  on-time pane is not the last one: first=True, last=False, ON_TIME) and a
  late pane, then reshuffled: Reshuffle restores each element's pane."""
  stream = (
      TestStream()
      .add_elements([bw.TimestampedValue(('k', 1), 1), bw.TimestampedValue(('k', 2), 2)])
      .advance_watermark_to(10)
      .add_elements([bw.TimestampedValue(('k', 3), 3)])
      .advance_watermark_to_infinity())
  grouped = (
      p
      | stream
      | 'Fixed' >> beam.WindowInto(
          bw.FixedWindows(10),
          trigger=tr.AfterWatermark(late=tr.AfterCount(1)),
          accumulation_mode=tr.AccumulationMode.DISCARDING,
          allowed_lateness=100)
      | beam.GroupByKey()
      | 'Sort' >> beam.MapTuple(lambda k, vs: (k, sorted(vs))))
  before = grouped | 'Before' >> beam.ParDo(FormatElement('grouped'))
  after = (
      grouped
      | beam.Reshuffle()
      | 'After' >> beam.ParDo(FormatElement('reshuffled')))
  return (before, after) | beam.Flatten()


# --- A side input from a GroupByKey that fires more than once ----------------


class WithSide(beam.DoFn):
  def process(self, e, ts=beam.DoFn.TimestampParam, w=beam.DoFn.WindowParam, side=beam.DoFn.SideInputParam):
    yield 'main %s %s @%s side=%s' % (e, fmt_window(w), millis(ts), sorted(side))


def multi_triggered_side_input(p):
  """Beam's sideinputs_test.test_multi_triggered_gbk_side_input: the side
  input's GroupByKey fires early ([100] and [400]) and on time (empty
  sums, 0) in each 5 s window; the main input sees both panes."""
  stream = (
      p
      | 'Mixed TestStream' >> TestStream()
      .advance_watermark_to(3, tag='main')
      .add_elements(['a1'], tag='main')
      .advance_watermark_to(8, tag='main')
      .add_elements(['a2'], tag='main')
      .add_elements([bw.TimestampedValue(('k', 100), 2)], tag='side')
      .add_elements([bw.TimestampedValue(('k', 400), 7)], tag='side')
      .advance_watermark_to_infinity(tag='main')
      .advance_watermark_to_infinity(tag='side'))
  main = (
      stream['main']
      | 'Main windowInto' >> beam.WindowInto(
          bw.FixedWindows(5), accumulation_mode=tr.AccumulationMode.DISCARDING))
  side = (
      stream['side']
      | 'Side windowInto' >> beam.WindowInto(
          bw.FixedWindows(5),
          trigger=tr.AfterWatermark(early=tr.AfterCount(1)),
          accumulation_mode=tr.AccumulationMode.DISCARDING)
      | beam.CombinePerKey(sum)
      | 'Values' >> beam.Map(lambda kv: kv[1]))
  return main | beam.ParDo(WithSide(), beam.pvalue.AsList(side))


# --- A processing-time trigger in batch ---------------------------------------


class OutputThenDelay(beam.DoFn):
  """Java's GroupByKeyTest.testAfterProcessingTimeContinuationTriggerUsingState:
  outputs 42, then an event-time timer just before the end of the global
  window sleeps, holding the watermark there while downstream runs."""
  DELAY = userstate.TimerSpec('delay', TimeDomain.WATERMARK)

  def process(self, element, w=beam.DoFn.WindowParam, delay=beam.DoFn.TimerParam(DELAY)):
    yield 42
    delay.set(w.max_timestamp() - 0.01)

  @userstate.on_timer(DELAY)
  def on_delay(self):
    import time
    time.sleep(1.5)
    return []


def batch_processing_time_trigger(p):
  """Batch: Repeatedly(AfterProcessingTime(0)) fires an early pane of
  the first sum while the upstream timer holds the watermark, and the
  second sum (its continuation trigger) fires that early pane too."""
  sums = (
      p
      | beam.Create([('dummy key', 0)])
      | beam.ParDo(OutputThenDelay())
      | 'Window' >> beam.WindowInto(
          bw.GlobalWindows(),
          trigger=tr.Repeatedly(tr.AfterProcessingTime(0)),
          accumulation_mode=tr.AccumulationMode.ACCUMULATING,
          allowed_lateness=0))
  first = sums | 'First sum' >> beam.CombineGlobally(sum).without_defaults()
  second = first | 'Second sum' >> beam.CombineGlobally(sum).without_defaults()
  return (
      (first | 'F1' >> beam.ParDo(FormatElement('first')),
       second | 'F2' >> beam.ParDo(FormatElement('second')))
      | 'Both' >> beam.Flatten())


# --- A processing-time timer's output timestamp -------------------------------


class ProcessingTimeEcho(beam.DoFn):
  """Keeps each key's value and sets a processing-time timer 0.2 s ahead;
  the timer outputs the value (Python sends the element's timestamp as the
  timer's hold, its output timestamp)."""
  TIMER = userstate.TimerSpec('echo', TimeDomain.REAL_TIME)
  VALUE = userstate.ReadModifyWriteStateSpec('value', beam.coders.VarIntCoder())

  def process(self, kv, timer=beam.DoFn.TimerParam(TIMER), value=beam.DoFn.StateParam(VALUE)):
    from apache_beam.utils.timestamp import Timestamp
    value.write(kv[1])
    timer.set(Timestamp.now() + 0.2)

  @userstate.on_timer(TIMER)
  def echo(self, key=beam.DoFn.KeyParam, value=beam.DoFn.StateParam(VALUE)):
    yield '%s:%d' % (key, value.read())


def processing_time_timer_output(p):
  """A processing-time timer's output carries its element's event time (the
  timer's hold) and window, not the wall clock it fired at."""
  return (
      p
      | beam.Create([('a', 10), ('b', 20), ('c', 70)])
      | beam.Map(lambda kv: bw.TimestampedValue(kv, kv[1]))
      | beam.WindowInto(bw.FixedWindows(60))
      | beam.ParDo(ProcessingTimeEcho())
      | beam.ParDo(FormatElement('fired')))


PIPELINES = {
    f.__name__: f
    for f in (
        test_stream_str_coder, timer_at_watermark, reshuffle_panes,
        reshuffle_streaming_panes, multi_triggered_side_input,
        batch_processing_time_trigger, processing_time_timer_output)
}

if __name__ == '__main__':
  pipelines.PIPELINES.update(PIPELINES)
  sys.exit(
      pipelines.main(
          sys.argv[1:],
          write=lambda output: beam.ParDo(WriteLines(os.path.abspath(output)))))
