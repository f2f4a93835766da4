"""Stateful-DoFn pipelines for Weir's end-to-end tests of user state.

    python pipelines_state.py NAME --output PREFIX [--error_file PATH] [beam options...]

Same command line and exit codes as pipelines.py (whose `main` runs these).
Each pipeline exercises one kind of user state of the Python SDK
(apache_beam.transforms.userstate) and writes lines that do not depend on the
order in which a runner hands a key's elements to the DoFn: per element, a
count that runs 1..n whatever the order; at the end of the window (an
event-time timer), the final contents of the state.
"""

import sys

import apache_beam as beam
from apache_beam.coders import StrUtf8Coder
from apache_beam.coders import VarIntCoder
from apache_beam.transforms import userstate
from apache_beam.transforms import window as beam_window
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import Timestamp

import pipelines

# Keys with a few values each, plus one key with many, so that a key's
# elements are likely spread over several bundles.
DATA = ([('a', v) for v in (5, 1, 4, 1)] + [('b', v) for v in (2, 7)] +
        [('many', v % 13) for v in range(300)])


def _flush_timer():
  """The event-time timer each DoFn sets to the end of the element's window
  (a TimerSpec takes one on_timer callback, so each DoFn has its own)."""
  return userstate.TimerSpec('flush', TimeDomain.WATERMARK)


def _set_flush(flush, w):
  flush.set(w.max_timestamp())


class ValueStateDoFn(beam.DoFn):
  """ReadModifyWriteStateSpec: a count and a running maximum per key."""
  FLUSH = _flush_timer()
  COUNT = userstate.ReadModifyWriteStateSpec('count', VarIntCoder())
  MAX = userstate.ReadModifyWriteStateSpec('max', VarIntCoder())

  def process(
      self,
      kv,
      w=beam.DoFn.WindowParam,
      count=beam.DoFn.StateParam(COUNT),
      top=beam.DoFn.StateParam(MAX),
      flush=beam.DoFn.TimerParam(FLUSH)):
    n = (count.read() or 0) + 1
    count.write(n)
    current = top.read()
    if current is None or kv[1] > current:
      top.write(kv[1])
    _set_flush(flush, w)
    yield 'seen %s %d' % (kv[0], n)

  @userstate.on_timer(FLUSH)
  def on_flush(
      self,
      key=beam.DoFn.KeyParam,
      count=beam.DoFn.StateParam(COUNT),
      top=beam.DoFn.StateParam(MAX)):
    yield 'final %s count=%d max=%d' % (key, count.read(), top.read())
    count.clear()
    yield 'cleared %s count=%r' % (key, count.read())


def state_value(p):
  return p | beam.Create(DATA) | beam.ParDo(ValueStateDoFn())


class BagStateDoFn(beam.DoFn):
  """BagStateSpec: every value of the key, read back per element and at the end."""
  FLUSH = _flush_timer()
  BAG = userstate.BagStateSpec('bag', VarIntCoder())

  def process(
      self,
      kv,
      w=beam.DoFn.WindowParam,
      bag=beam.DoFn.StateParam(BAG),
      flush=beam.DoFn.TimerParam(FLUSH)):
    bag.add(kv[1])
    _set_flush(flush, w)
    yield 'seen %s %d' % (kv[0], len(list(bag.read())))

  @userstate.on_timer(FLUSH)
  def on_flush(self, key=beam.DoFn.KeyParam, bag=beam.DoFn.StateParam(BAG)):
    yield 'final %s %s' % (key, sorted(bag.read()))
    bag.clear()
    bag.add(-1)
    yield 'after clear %s %s' % (key, list(bag.read()))


def state_bag(p):
  return p | beam.Create(DATA) | beam.ParDo(BagStateDoFn())


class MinMaxFn(beam.CombineFn):
  """A CombineFn with a tuple accumulator (min, max); no input gives None."""
  _EMPTY = (1 << 62, -(1 << 62))

  def create_accumulator(self):
    return self._EMPTY

  def add_input(self, acc, x):
    return min(acc[0], x), max(acc[1], x)

  def merge_accumulators(self, accs):
    lo, hi = self._EMPTY  # the SDK merges an empty bag of accumulators too
    for a in accs:
      lo, hi = min(lo, a[0]), max(hi, a[1])
    return lo, hi

  def extract_output(self, acc):
    return None if acc == self._EMPTY else acc


class CombiningStateDoFn(beam.DoFn):
  """CombiningValueStateSpec with a builtin (sum) and CombineFns (count, and
  min and max with a tuple accumulator)."""
  FLUSH = _flush_timer()
  TOTAL = userstate.CombiningValueStateSpec('total', combine_fn=sum)
  MINMAX = userstate.CombiningValueStateSpec(
      'minmax', beam.coders.TupleCoder((VarIntCoder(), VarIntCoder())), MinMaxFn())
  SEEN = userstate.CombiningValueStateSpec(
      'seen', VarIntCoder(), beam.combiners.CountCombineFn())

  def process(
      self,
      kv,
      w=beam.DoFn.WindowParam,
      total=beam.DoFn.StateParam(TOTAL),
      minmax=beam.DoFn.StateParam(MINMAX),
      seen=beam.DoFn.StateParam(SEEN),
      flush=beam.DoFn.TimerParam(FLUSH)):
    total.add(kv[1])
    minmax.add(kv[1])
    seen.add(1)
    _set_flush(flush, w)
    yield 'seen %s %d' % (kv[0], seen.read())

  @userstate.on_timer(FLUSH)
  def on_flush(
      self,
      key=beam.DoFn.KeyParam,
      total=beam.DoFn.StateParam(TOTAL),
      minmax=beam.DoFn.StateParam(MINMAX)):
    yield 'final %s total=%d minmax=%s' % (key, total.read(), minmax.read())
    total.clear()
    minmax.clear()
    yield 'after clear %s total=%d minmax=%s' % (key, total.read(), minmax.read())


def state_combining(p):
  return p | beam.Create(DATA) | beam.ParDo(CombiningStateDoFn())


class SetStateDoFn(beam.DoFn):
  """SetStateSpec: per element, whether the value was in the set already
  (False once per distinct value, True for each repeat, in any order)."""
  FLUSH = _flush_timer()
  SEEN = userstate.SetStateSpec('seen', VarIntCoder())

  def process(
      self,
      kv,
      w=beam.DoFn.WindowParam,
      seen=beam.DoFn.StateParam(SEEN),
      flush=beam.DoFn.TimerParam(FLUSH)):
    repeat = kv[1] in seen.read()
    seen.add(kv[1])
    _set_flush(flush, w)
    yield 'seen %s %d %s' % (kv[0], kv[1], repeat)

  @userstate.on_timer(FLUSH)
  def on_flush(self, key=beam.DoFn.KeyParam, seen=beam.DoFn.StateParam(SEEN)):
    yield 'final %s %s' % (key, sorted(seen.read()))


def state_set(p):
  return p | beam.Create(DATA) | beam.ParDo(SetStateDoFn())


def _micros(ts_values):
  """(sort key in micros, value) pairs after checking that they came in
  sort-key order; equal sort keys may come in any order, so they are sorted
  by value."""
  pairs = [(t.micros, v) for t, v in ts_values]
  keys = [k for k, _ in pairs]
  if keys != sorted(keys):
    return 'NOT IN SORT-KEY ORDER: %s' % pairs
  return sorted(pairs)


class OrderedListStateDoFn(beam.DoFn):
  """OrderedListStateSpec: values keyed by a timestamp sort key; add,
  read, read_range, clear_range and clear."""
  FLUSH = _flush_timer()
  EVENTS = userstate.OrderedListStateSpec('events', StrUtf8Coder())

  def process(
      self,
      kv,
      w=beam.DoFn.WindowParam,
      events=beam.DoFn.StateParam(EVENTS),
      flush=beam.DoFn.TimerParam(FLUSH)):
    key, (sort_key, value) = kv
    events.add((Timestamp(micros=sort_key), value))
    _set_flush(flush, w)
    yield 'seen %s %d' % (key, len(list(events.read())))

  @userstate.on_timer(FLUSH)
  def on_flush(self, key=beam.DoFn.KeyParam, events=beam.DoFn.StateParam(EVENTS)):
    if key == 'big':
      # About 3 MB of values: the runner answers in several pages.
      got = [(t.micros, v) for t, v in events.read()]
      keys = [k for k, _ in got]
      yield 'big: %d values, sorted=%s, bytes=%d, first=%d last=%d' % (
          len(got), keys == sorted(keys), sum(len(v) for _, v in got), keys[0],
          keys[-1])
      return
    yield 'all %s %s' % (key, _micros(events.read()))
    yield 'range [0,10) %s %s' % (
        key, _micros(events.read_range(Timestamp(micros=0), Timestamp(micros=10))))
    events.clear_range(Timestamp(micros=-5), Timestamp(micros=5))
    yield 'after clear_range [-5,5) %s %s' % (key, _micros(events.read()))
    events.add((Timestamp(micros=2), 'late'))
    yield 'after add 2 %s %s' % (
        key, _micros(events.read_range(Timestamp(micros=-100), Timestamp(micros=100))))
    events.clear()
    yield 'after clear %s %s' % (key, _micros(events.read()))


def state_ordered_list(p):
  data = [('a', (s, 'a%d' % s)) for s in (7, -3, 12, 0, 4, -8, 9, 5)]
  data += [('a', (4, 'a4-again')), ('b', (1, 'b1')), ('b', (-20, 'b-20'))]
  data += [('big', ((i * 7919) % 3001 - 1500, 'v%04d-' % i + 'x' * 1000))
           for i in range(3000)]
  return p | beam.Create(data) | beam.ParDo(OrderedListStateDoFn())


class WindowedBagDoFn(beam.DoFn):
  """A bag per (key, window): the same key in two fixed windows sees two
  separate bags."""
  FLUSH = _flush_timer()
  BAG = userstate.BagStateSpec('bag', VarIntCoder())
  COUNT = userstate.ReadModifyWriteStateSpec('count', VarIntCoder())

  def process(
      self,
      kv,
      w=beam.DoFn.WindowParam,
      bag=beam.DoFn.StateParam(BAG),
      count=beam.DoFn.StateParam(COUNT),
      flush=beam.DoFn.TimerParam(FLUSH)):
    bag.add(kv[1])
    n = (count.read() or 0) + 1
    count.write(n)
    _set_flush(flush, w)
    yield 'seen %s [%s, %s) %d' % (kv[0], w.start, w.end, n)

  @userstate.on_timer(FLUSH)
  def on_flush(
      self,
      key=beam.DoFn.KeyParam,
      w=beam.DoFn.WindowParam,
      bag=beam.DoFn.StateParam(BAG),
      count=beam.DoFn.StateParam(COUNT)):
    yield 'final %s [%s, %s) count=%d %s' % (
        key, w.start, w.end, count.read(), sorted(bag.read()))


def state_windowed(p):
  # key 'a' in windows [0, 10) and [10, 20); key 'b' only in [10, 20).
  data = [('a', 1, 1), ('a', 2, 3), ('a', 3, 9), ('a', 10, 10), ('a', 20, 15),
          ('b', 100, 12), ('b', 200, 19)]
  return (
      p
      | beam.Create(data)
      | 'Stamp' >> beam.Map(
          lambda kvt: beam_window.TimestampedValue((kvt[0], kvt[1]), kvt[2]))
      | beam.WindowInto(beam_window.FixedWindows(10))
      | beam.ParDo(WindowedBagDoFn()))


class FlakyBagDoFn(beam.DoFn):
  """Adds to a bag, then fails the first attempt at the bundle holding value
  3 (a marker file remembers): a retried bundle must not add twice."""
  FLUSH = _flush_timer()
  BAG = userstate.BagStateSpec('bag', VarIntCoder())

  def __init__(self, marker):
    self._marker = marker

  def process(
      self,
      kv,
      w=beam.DoFn.WindowParam,
      bag=beam.DoFn.StateParam(BAG),
      flush=beam.DoFn.TimerParam(FLUSH)):
    import os
    bag.add(kv[1])
    _set_flush(flush, w)
    if kv[1] == 3 and not os.path.exists(self._marker):
      open(self._marker, 'w').close()
      raise RuntimeError('weir-flaky-state: first attempt fails')
    yield 'seen %s %d' % (kv[0], kv[1])

  @userstate.on_timer(FLUSH)
  def on_flush(self, key=beam.DoFn.KeyParam, bag=beam.DoFn.StateParam(BAG)):
    yield 'final %s %s' % (key, sorted(bag.read()))


def state_flaky(p):
  import os
  marker = os.path.join(
      os.path.dirname(os.path.abspath(pipelines.FLAGS.output)), 'flaky-marker')
  return (
      p
      | beam.Create([('r', v) for v in range(6)])
      | beam.ParDo(FlakyBagDoFn(marker)))


class BigBagDoFn(beam.DoFn):
  """A bag of 100 KB strings per key: about 2 MB of user state per key."""
  FLUSH = _flush_timer()
  BAG = userstate.BagStateSpec('big', StrUtf8Coder())

  def process(
      self,
      kv,
      w=beam.DoFn.WindowParam,
      bag=beam.DoFn.StateParam(BAG),
      flush=beam.DoFn.TimerParam(FLUSH)):
    bag.add(kv[1] * 100_000)
    _set_flush(flush, w)
    return []

  @userstate.on_timer(FLUSH)
  def on_flush(self, key=beam.DoFn.KeyParam, bag=beam.DoFn.StateParam(BAG)):
    values = list(bag.read())
    yield 'big %s %d values %d chars' % (key, len(values), sum(map(len, values)))


def state_big_bag(p):
  """4 keys x 20 values of 100 KB: about 8 MB of user state at once."""
  return (
      p
      | beam.Create([('k%d' % (i % 4), 'abcdefghij'[i % 10]) for i in range(80)])
      | beam.ParDo(BigBagDoFn()))


PIPELINES = {
    f.__name__: f
    for f in (state_value, state_bag, state_combining, state_set,
              state_ordered_list, state_windowed, state_flaky, state_big_bag)
}

if __name__ == '__main__':
  pipelines.PIPELINES.update(PIPELINES)
  sys.exit(pipelines.main(sys.argv[1:]))
