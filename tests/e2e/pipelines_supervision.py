"""Pipelines for the supervision tests (test_supervision.py), runnable as a script
the same way as pipelines.py (whose main() this reuses):

    python pipelines_supervision.py NAME --output PREFIX [--error_file PATH] [beam options...]

The script logs at INFO so the job's messages (which the PortableRunner logs)
reach stderr, where the tests read them.
"""

import logging
import os
import sys
import time

import apache_beam as beam

import pipelines


def _in_sdk_harness():
  """True inside an SDK harness that Weir started (`weir boot` sets WORKER_ID);
  false under DirectRunner, so the same pipeline gives the reference output."""
  return 'WORKER_ID' in os.environ


def crash_once(p):
  """The SDK harness process dies (os._exit) the first time it sees element 7
  (a marker file under --output's folder remembers); then a GroupByKey."""
  marker = os.path.join(
      os.path.dirname(os.path.abspath(pipelines.FLAGS.output)), 'crash-marker')

  def once(x):
    if x == 7 and _in_sdk_harness() and not os.path.exists(marker):
      open(marker, 'w').close()
      os._exit(17)
    return ('k%d' % (x % 3), x)

  return (p
          | beam.Create(list(range(20)))
          | 'CrashOnce' >> beam.Map(once)
          | beam.GroupByKey()
          | 'Format' >> beam.MapTuple(lambda k, vs: '%s: %s' % (k, sorted(vs))))


def stuck(p):
  """Element 2 sleeps 600 s inside SDK harnesses (a stuck element)."""
  def nap(x):
    if x == 2 and _in_sdk_harness():
      time.sleep(600)
    return 'n%d' % x

  return p | beam.Create([1, 2, 3]) | 'SleepyTransform' >> beam.Map(nap)


def steady(p):
  """Eight elements of one second each in one bundle: the bundle takes longer
  than a short element processing timeout, but no single element does."""
  def tick(x):
    time.sleep(1)
    return 't%d' % x

  return p | beam.Create(list(range(8))) | 'Tick' >> beam.Map(tick)


def backlog(p):
  """Three independent branches of slow elements (more bundles at once than
  one SDK harness takes), then one slow bundle after a GroupByKey to a single
  key (the other harnesses sit idle meanwhile)."""
  def slow(x):
    time.sleep(1.5)
    return x

  branches = [
      p
      | 'Create%d' % b >> beam.Create([b * 10 + i for i in range(4)])
      | 'Slow%d' % b >> beam.Map(slow)
      for b in range(3)
  ]

  def last(kv):
    time.sleep(9)
    return 'total %d of %d' % (sum(kv[1]), len(list(kv[1])))

  return (branches
          | beam.Flatten()
          | beam.Map(lambda x: ('all', x))
          | beam.GroupByKey()
          | 'Last' >> beam.Map(last))


def overlap(p):
  """Two independent branches, one slow element each, which output the SDK
  process id and their start and end times: whether one SDK harness ran
  both bundles at once shows in the output."""
  def timed(x):
    start = time.time()
    time.sleep(3)
    return '%d %s %.3f %.3f' % (os.getpid(), x, start, time.time())

  return ([p | 'Create%s' % b >> beam.Create([b]) | 'Timed%s' % b >> beam.Map(timed)
           for b in ('a', 'b')]
          | beam.Flatten())


class _Discard(beam.PTransform):
  """Stands in for WriteToText in streaming runs: Python's streaming file
  sink needs a pickled Python transform no portable runner executes."""
  def __init__(self, *unused_args):
    super().__init__()

  def expand(self, pcoll):
    return pcoll | 'Discard' >> beam.Map(lambda _: None)


PIPELINES = {
    f.__name__: f for f in (crash_once, stuck, steady, backlog, overlap)
}


if __name__ == '__main__':
  logging.basicConfig(stream=sys.stderr)
  logging.getLogger().setLevel(logging.INFO)
  pipelines.PIPELINES.update(PIPELINES)
  if '--streaming' in sys.argv:
    pipelines.WriteToText = _Discard
  sys.exit(pipelines.main(sys.argv[1:]))
