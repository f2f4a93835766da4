"""Small Beam pipelines for Weir's end-to-end tests, runnable as a script.

    python pipelines.py NAME --output PREFIX [--error_file PATH] [beam options...]

Builds pipeline NAME, writes its result with WriteToText(PREFIX) and runs it
with the given Beam options (DirectRunner, or PortableRunner against Weir).
When the pipeline fails, the text of the exception that the client got from
`run().wait_until_finish()` is written to --error_file (if given) and the
process exits with status 3, so tests can tell "the pipeline failed and the
client was told why" from a crash of this script.
"""

import argparse
import sys
import traceback

import apache_beam as beam
from apache_beam.io import WriteToText
from apache_beam.options.pipeline_options import PipelineOptions


class FLAGS:  # set by main(); read by pipelines that need the output folder
  output = None


def gbk(p):
  """Create + Map + GroupByKey, values sorted so the output is deterministic."""
  data = [('a', 1), ('b', 2), ('a', 3), ('c', 4), ('b', 5), ('a', 6)]
  data += [('k%d' % (i % 7), i) for i in range(100)]
  return (
      p
      | beam.Create(data)
      | 'Times10' >> beam.Map(lambda kv: (kv[0], kv[1] * 10))
      | beam.GroupByKey()
      | 'Format' >> beam.MapTuple(lambda k, vs: '%s: %s' % (k, sorted(vs))))


def flatten(p):
  """Flatten of two Creates (with a duplicate across them)."""
  left = p | 'Left' >> beam.Create(['x1', 'x2', 'shared'])
  right = p | 'Right' >> beam.Create(['y1', 'y2', 'y3', 'shared'])
  return ((left, right)
          | beam.Flatten()
          | 'Tag' >> beam.Map(lambda s: 'flat: %s' % s))


def side_input(p):
  """A main input mapped against a side input read with beam.pvalue.AsList."""
  side = (
      p
      | 'Side' >> beam.Create([1, 2, 3, 4])
      | 'Hundreds' >> beam.Map(lambda x: x * 100))
  return (
      p
      | 'Main' >> beam.Create(list(range(12)))
      | 'UseSide' >> beam.Map(
          lambda x, s: '%d: %d %s' % (x, x + sum(s), sorted(s)),
          s=beam.pvalue.AsList(side)))


def combine_per_key(p):
  """CombinePerKey with a sum and with a mean, joined back by key."""
  words = ('the quick brown fox jumps over the lazy dog the end ' * 5).split()
  pairs = p | beam.Create([(w, len(w)) for w in words])
  sums = pairs | 'Sum' >> beam.CombinePerKey(sum)
  means = pairs | 'Mean' >> beam.CombinePerKey(beam.combiners.MeanCombineFn())
  return ((sums, means)
          | beam.Flatten()
          | 'Format' >> beam.MapTuple(lambda k, v: '%s: %r' % (k, v)))


def good(p):
  """A tiny pipeline whose exact output the tests know: {'x: 4', 'y: 2'}."""
  return (
      p
      | beam.Create([('x', 1), ('y', 2), ('x', 3)])
      | beam.GroupByKey()
      | 'Format' >> beam.MapTuple(lambda k, vs: '%s: %d' % (k, sum(vs))))


def boom(p):
  """A DoFn that raises ValueError('weir-boom') on one element."""
  def explode(x):
    if x == 2:
      raise ValueError('weir-boom')
    return str(x)

  return p | beam.Create([1, 2, 3]) | 'Explode' >> beam.Map(explode)


def windowed(p):
  """Timestamped KVs in fixed and in session windows, grouped; window bounds in the output."""
  from apache_beam.transforms import window
  events = [('k%d' % (i % 3), i, i * 7 % 100) for i in range(60)]
  stamped = (
      p
      | 'Events' >> beam.Create(events)
      | 'Stamp' >> beam.Map(lambda e: window.TimestampedValue((e[0], e[1]), e[2])))

  def fmt(kind):
    def f(kv, w=beam.DoFn.WindowParam, t=beam.DoFn.TimestampParam):
      return '%s %s [%s, %s) @%s: %s' % (kind, kv[0], w.start, w.end, t, sorted(kv[1]))
    return f

  fixed = (stamped
           | 'Fixed' >> beam.WindowInto(window.FixedWindows(10))
           | 'GroupFixed' >> beam.GroupByKey()
           | 'FormatFixed' >> beam.Map(fmt('fixed')))
  sessions = (stamped
              | 'Sessions' >> beam.WindowInto(window.Sessions(5))
              | 'GroupSessions' >> beam.GroupByKey()
              | 'FormatSessions' >> beam.Map(fmt('session')))
  return (fixed, sessions) | 'Both' >> beam.Flatten()


class DecadeWindows(beam.transforms.window.WindowFn):
  """A custom merging WindowFn (Beam runs its `merge` in the SDK): each
  element gets the window [t, t + 1) (seconds); windows whose starts fall
  in the same decade [10n, 10n + 10) merge into one spanning them all,
  whether or not they touch (unlike sessions)."""
  def assign(self, context):
    from apache_beam.transforms import window
    return [window.IntervalWindow(context.timestamp, context.timestamp + 1)]

  def merge(self, merge_context):
    from apache_beam.transforms import window
    by_decade = {}
    for w in merge_context.windows:
      by_decade.setdefault(int(w.start) // 10, []).append(w)
    for ws in by_decade.values():
      if len(ws) > 1:
        merge_context.merge(
            ws,
            window.IntervalWindow(min(w.start for w in ws), max(w.end for w in ws)))

  def get_window_coder(self):
    from apache_beam.coders import coders
    return coders.IntervalWindowCoder()


def custom_merging(p):
  """A custom merging WindowFn (DecadeWindows), grouped and combined
  (CombinePerKey(sum) is lifted: partial sums per unmerged window merge in
  the GroupByKey); window bounds in the output."""
  from apache_beam.transforms import window
  events = [('k%d' % (i % 3), i, i * 7 % 50) for i in range(40)]
  stamped = (
      p
      | 'Events' >> beam.Create(events)
      | 'Stamp' >> beam.Map(lambda e: window.TimestampedValue((e[0], e[1]), e[2]))
      | 'Decades' >> beam.WindowInto(DecadeWindows()))

  def fmt(kind):
    def f(kv, w=beam.DoFn.WindowParam, t=beam.DoFn.TimestampParam):
      v = sorted(kv[1]) if kind == 'group' else kv[1]
      return '%s %s [%s, %s) @%s: %s' % (kind, kv[0], w.start, w.end, t, v)
    return f

  grouped = stamped | 'Group' >> beam.GroupByKey() | 'FormatGroup' >> beam.Map(fmt('group'))
  summed = stamped | 'Sum' >> beam.CombinePerKey(sum) | 'FormatSum' >> beam.Map(fmt('sum'))
  return (grouped, summed) | 'Both' >> beam.Flatten()


def multimap_side_input(p):
  """A side input read as a multimap (beam.pvalue.AsMultiMap)."""
  side = p | 'Side' >> beam.Create([('a', 1), ('b', 2), ('a', 3), ('c', 4)])
  return (
      p
      | 'Main' >> beam.Create(['a', 'b', 'c', 'd'])
      | 'Lookup' >> beam.Map(
          lambda k, m: '%s: %s' % (k, sorted(m[k])), m=beam.pvalue.AsMultiMap(side)))


def sdf_split(p):
  """One large splittable restriction, slow enough for Weir to split it across SDK workers."""
  import time
  from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
  from apache_beam.transforms.core import RestrictionProvider

  class Provider(RestrictionProvider):
    def initial_restriction(self, element):
      return OffsetRange(0, element)

    def create_tracker(self, restriction):
      return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element, restriction):
      return restriction.size()

  class Count(beam.DoFn):
    def process(self, element, tracker=beam.DoFn.RestrictionParam(Provider())):
      i = tracker.current_restriction().start
      while tracker.try_claim(i):
        time.sleep(0.002)
        yield i
        i += 1

  return (p
          | beam.Create([1500])
          | beam.ParDo(Count())
          | 'Format' >> beam.Map(lambda i: 'n%d' % i))


def sdf_restrictions(p):
  """Six splittable restrictions of 150 slow claims each: a batch runner may
  send them to an SDK harness as one bundle and split it for idle workers."""
  import time
  from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
  from apache_beam.transforms.core import RestrictionProvider

  class Provider(RestrictionProvider):
    def initial_restriction(self, element):
      return OffsetRange(0, element[1])

    def create_tracker(self, restriction):
      return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element, restriction):
      return restriction.size()

  class Claims(beam.DoFn):
    def process(self, element, tracker=beam.DoFn.RestrictionParam(Provider())):
      i = tracker.current_restriction().start
      while tracker.try_claim(i):
        time.sleep(0.004)
        yield '%s:%d' % (element[0], i)
        i += 1

  return p | beam.Create([('r%d' % k, 150) for k in range(6)]) | beam.ParDo(Claims())


def large_elements(p):
  """Elements of 6 MiB through a GroupByKey and a side input (over tonic's 4 MiB default)."""
  big = 6 * 1024 * 1024
  side = p | 'Side' >> beam.Create(['s' * big])
  return (
      p
      | 'Big' >> beam.Create([('k', 'x' * big), ('k', 'y' * big), ('j', 'z' * big)])
      | beam.GroupByKey()
      | 'Sizes' >> beam.Map(
          lambda kv, s: '%s: %s side=%d' % (
              kv[0], sorted((v[0], len(v)) for v in kv[1]), len(s[0])),
          s=beam.pvalue.AsList(side)))


def paged_side_input(p):
  """An AsList side input of 140 MiB (140 strings of 1 MiB, made by a DoFn),
  more than one page of a State API Get (Weir's pages are 128 MiB), read
  whole by each of three main-input elements."""
  mib = 1024 * 1024
  side = p | 'Side' >> beam.Create(range(140)) | 'Strings' >> beam.Map(
      lambda i: chr(ord('a') + i % 26) * mib)
  return (
      p
      | 'Main' >> beam.Create(['x', 'y', 'z'])
      | 'Read' >> beam.Map(
          lambda m, s: '%s: %d strings, %d bytes, first letters %s' % (
              m, len(s), sum(len(v) for v in s), ''.join(sorted(v[0] for v in s))),
          s=beam.pvalue.AsList(side)))


def big_side_input(p):
  """An AsList side input of 4 strings of 1 MiB, read by two main-input
  elements (more than a 1 MiB side-input budget)."""
  side = p | 'Side' >> beam.Create(range(4)) | 'Strings' >> beam.Map(
      lambda i: chr(ord('a') + i) * (1024 * 1024))
  return (
      p
      | 'Main' >> beam.Create(['x', 'y'])
      | 'Read' >> beam.Map(
          lambda m, s: '%s: %d strings, %d bytes' % (m, len(s), sum(len(v) for v in s)),
          s=beam.pvalue.AsList(side)))


def flaky(p):
  """A DoFn that fails the first time it sees element 3 (a marker file under
  --output's folder remembers), so only a runner that retries the bundle
  succeeds; the output must hold every element exactly once."""
  import os
  marker = os.path.join(os.path.dirname(os.path.abspath(FLAGS.output)), 'flaky-marker')

  def once(x):
    if x == 3 and not os.path.exists(marker):
      open(marker, 'w').close()
      raise RuntimeError('weir-flaky: first attempt fails')
    return 'v%d' % x

  return p | beam.Create(list(range(6))) | 'Flaky' >> beam.Map(once)


def crash(p):
  """A DoFn whose SDK harness process dies (os._exit) the first time it sees
  element 3 (a marker file remembers); the bundle must be retried on another
  SDK harness, with every element in the output exactly once. PROCESS only."""
  import os
  marker = os.path.join(os.path.dirname(os.path.abspath(FLAGS.output)), 'crash-marker')

  def once(x):
    if x == 3 and not os.path.exists(marker):
      open(marker, 'w').close()
      os._exit(17)
    return 'c%d' % x

  return p | beam.Create(list(range(6))) | 'Crash' >> beam.Map(once)


def slow(p):
  """A DoFn that sleeps long enough for a test to cancel the job."""
  import time

  def nap(x):
    time.sleep(60)
    return x

  return p | beam.Create([1, 2]) | 'Nap' >> beam.Map(nap)


def hot_key(p):
  """A GroupByKey where one key ('hot') holds most of the values among many
  (a worker reports a key hot only among 8 keys or more)."""
  data = [('hot', i) for i in range(3000)] + [('k%d' % (i % 40), i) for i in range(800)]
  return (p
          | beam.Create(data)
          | beam.GroupByKey()
          | 'Count' >> beam.MapTuple(lambda k, vs: '%s: %d' % (k, len(list(vs)))))


def four_shards(p):
  """A GroupByKey of 8000 values spread evenly over 4 keys, as a sharded
  write groups its output: no key is hot."""
  return (p
          | beam.Create([('shard%d' % (i % 4), i) for i in range(8000)])
          | beam.GroupByKey()
          | 'Count' >> beam.MapTuple(lambda k, vs: '%s: %d' % (k, len(list(vs)))))


def fan_out_gbk(p):
  """Four elements fanning out to 60,000 records each (~6 MB of output per
  bundle), then a GroupByKey of 20,000 keys: under a small memory budget the
  bundles' outputs and the GroupByKey's groups both spill to disk."""
  import hashlib

  def records(shard):
    for j in range(60000):
      yield ('k%05d' % ((shard * 60000 + j) % 20000), '%d-%d-' % (shard, j) + 'v' * 70)

  def summary(kv):
    values = sorted(kv[1])
    digest = hashlib.sha1('|'.join(values).encode()).hexdigest()[:12]
    return '%s %d %s' % (kv[0], len(values), digest)

  return (p
          | beam.Create([0, 1, 2, 3])
          | beam.Reshuffle()
          | 'Records' >> beam.FlatMap(records)
          | beam.GroupByKey()
          | 'Summary' >> beam.Map(summary))


def slow_elements(p):
  """60 elements, reshuffled, then 0.1 s each in a plain Map: a bundle of
  many slow elements that a runner can split on its data channel."""
  import time

  def slow(x):
    time.sleep(0.1)
    return 'x=%d double=%d' % (x, 2 * x)

  return p | beam.Create(list(range(60))) | beam.Reshuffle() | 'Slow' >> beam.Map(slow)


PIPELINES = {
    f.__name__: f
    for f in (gbk, flatten, side_input, combine_per_key, good, boom, windowed, custom_merging,
              multimap_side_input, sdf_split, sdf_restrictions, large_elements, paged_side_input, big_side_input, flaky, crash, slow, hot_key, four_shards,
              fan_out_gbk, slow_elements)
}


def main(argv, write=WriteToText):
  """Runs the pipeline named in `argv`; `write(output)` is the sink its
  result goes to (WriteToText, or a DoFn for unbounded results)."""
  parser = argparse.ArgumentParser()
  parser.add_argument('name', choices=sorted(PIPELINES))
  parser.add_argument('--output', required=True)
  parser.add_argument('--error_file', default=None)
  parser.add_argument('--cancel_after', type=float, default=None,
                      help='cancel the job this many seconds after it runs')
  args, beam_args = parser.parse_known_args(argv)
  FLAGS.output = args.output

  p = beam.Pipeline(options=PipelineOptions(beam_args))
  _ = PIPELINES[args.name](p) | 'Write' >> write(args.output)
  try:
    result = p.run()
    if args.cancel_after is not None:
      import time
      time.sleep(args.cancel_after)
      result.cancel()
    state = result.wait_until_finish()
  except Exception as e:  # pylint: disable=broad-except
    text = '%s: %s' % (type(e).__name__, e)
    traceback.print_exc()
    if args.error_file:
      with open(args.error_file, 'w') as f:
        f.write(text)
    print('PIPELINE FAILED: %s' % text, file=sys.stderr)
    return 3
  print('PIPELINE STATE: %s' % state)
  if str(state).split('.')[-1] != 'DONE':
    print('PIPELINE did not finish in state DONE: %s' % state, file=sys.stderr)
    return 4
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
