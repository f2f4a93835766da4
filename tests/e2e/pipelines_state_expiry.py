"""Streaming stateful-DoFn pipelines for Weir's end-to-end test of user-state
expiry (test_state_expiry.py), runnable as a script:

    python pipelines_state_expiry.py NAME --output PREFIX [--error_file PATH] [beam options...]

Same command line and exit codes as pipelines.py; lines are written as in
pipelines_streaming.py (one file per bundle, PREFIX-<uuid>-of-stream).

Each pipeline replays the TestStream EVENTS into `CountAndBuffer`, a
stateful DoFn that keeps a count (value state) and a bag of values per key
and window and never clears them: only the runner's garbage collection of
expired windows removes that state. Per element it writes

    seen KEY WINDOW N                         (N runs 1..n per key and window)

and from an event-time timer at the end of the window

    flush KEY WINDOW count=N [sorted bag]

The pipelines differ in windowing only: FixedWindows(10) with no allowed
lateness, FixedWindows(10) with 5 s allowed lateness, the global window.
"""

import os
import sys

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.transforms import userstate
from apache_beam.transforms import window as bw
from apache_beam.transforms.timeutil import TimeDomain

import pipelines
from pipelines_streaming import WriteLines
from pipelines_streaming import _stream
from pipelines_streaming import fmt_window

# (key, value, timestamp seconds) batches and watermark moves; value 11 at
# 7 s is late for [0, 10) (within 5 s of lateness), value 12 at 8 s comes
# after [0, 10) expired in both windowed pipelines.
EVENTS = [
    ('e', [('a', 1, 1), ('a', 2, 3), ('b', 3, 5), ('a', 4, 12), ('c', 5, 15)]),
    ('w', 10),
    ('e', [('a', 11, 7), ('a', 6, 11), ('b', 7, 25), ('c', 8, 18)]),
    ('w', 20),
    ('e', [('a', 12, 8), ('b', 9, 27), ('c', 10, 21)]),
    ('end',),
]


class CountAndBuffer(beam.DoFn):
  """A count and a bag per key and window, flushed (read, not cleared) by an
  event-time timer at the end of the window."""
  COUNT = userstate.ReadModifyWriteStateSpec('count', VarIntCoder())
  BAG = userstate.BagStateSpec('bag', VarIntCoder())
  FLUSH = userstate.TimerSpec('flush', TimeDomain.WATERMARK)

  def process(
      self,
      kv,
      w=beam.DoFn.WindowParam,
      count=beam.DoFn.StateParam(COUNT),
      bag=beam.DoFn.StateParam(BAG),
      flush=beam.DoFn.TimerParam(FLUSH)):
    n = (count.read() or 0) + 1
    count.write(n)
    bag.add(kv[1])
    flush.set(w.max_timestamp())
    yield 'seen %s %s %d' % (kv[0], fmt_window(w), n)

  @userstate.on_timer(FLUSH)
  def on_flush(
      self,
      key=beam.DoFn.KeyParam,
      w=beam.DoFn.WindowParam,
      count=beam.DoFn.StateParam(COUNT),
      bag=beam.DoFn.StateParam(BAG)):
    yield 'flush %s %s count=%s %s' % (
        key, fmt_window(w), count.read(), sorted(bag.read()))


def _count_and_buffer(p, windowfn, lateness):
  return (
      p
      | 'Stream' >> _stream(EVENTS)
      | 'Window' >> beam.WindowInto(windowfn, allowed_lateness=lateness)
      | 'Buffer' >> beam.ParDo(CountAndBuffer()))


def expiry_fixed(p):
  return _count_and_buffer(p, bw.FixedWindows(10), 0)


def expiry_fixed_lateness(p):
  return _count_and_buffer(p, bw.FixedWindows(10), 5)


def expiry_global(p):
  return _count_and_buffer(p, bw.GlobalWindows(), 0)


PIPELINES = {
    f.__name__: f for f in (expiry_fixed, expiry_fixed_lateness, expiry_global)
}

if __name__ == '__main__':
  pipelines.PIPELINES.update(PIPELINES)
  sys.exit(
      pipelines.main(
          sys.argv[1:],
          write=lambda output: beam.ParDo(WriteLines(os.path.abspath(output)))))
