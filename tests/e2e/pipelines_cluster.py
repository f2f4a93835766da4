"""Pipelines for test_cluster.py: runs that cross worker processes.

    python pipelines_cluster.py NAME --output PREFIX [Beam options...]

* `keyed`: 600 numbers reshuffled, grouped by x % 13 and summed; each element
  sleeps `--sleep_ms` first, so a test can kill a worker mid-job.
* `stateful`: a stateful DoFn (BagState plus a ValueState counter) over 40
  keys: every key's running count and its sorted values.
* `side_input`: each of 200 numbers joined with a dict side input and a
  singleton side input computed upstream.
* `unbounded`: a two-minute streaming job (PeriodicImpulse), for a test to
  kill a worker of.
"""

import argparse
import logging
import sys
import time

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec


def keyed(p, sleep_ms):
  napped = beam.metrics.Metrics.counter('cluster', 'napped')

  def nap(x):
    napped.inc()
    if sleep_ms:
      time.sleep(sleep_ms / 1000.0)
    return x

  return (p
          | beam.Create(list(range(600)))
          | beam.Reshuffle()
          | 'Nap' >> beam.Map(nap)
          | beam.Map(lambda x: (x % 13, x))
          | beam.CombinePerKey(sum)
          | beam.MapTuple(lambda k, s: '%d:%d' % (k, s)))


class CountPerKey(beam.DoFn):
  SEEN = BagStateSpec('seen', VarIntCoder())
  COUNT = ReadModifyWriteStateSpec('count', VarIntCoder())

  def process(self, kv, seen=beam.DoFn.StateParam(SEEN),
              count=beam.DoFn.StateParam(COUNT)):
    k, v = kv
    seen.add(v)
    n = (count.read() or 0) + 1
    count.write(n)
    if n == 5:
      yield '%s:%s' % (k, ','.join(str(x) for x in sorted(seen.read())))


def stateful(p, sleep_ms):
  del sleep_ms
  return (p
          | beam.Create([('k%02d' % (i % 40), i) for i in range(200)])
          | beam.Reshuffle()
          | beam.ParDo(CountPerKey()))


def side_input(p, sleep_ms):
  del sleep_ms
  names = p | 'Names' >> beam.Create([(i, 'n%d' % (i * i)) for i in range(0, 200, 3)])
  total = (p
           | 'Weights' >> beam.Create(list(range(1, 11)))
           | beam.CombineGlobally(sum))
  return (p
          | 'Main' >> beam.Create(list(range(200)))
          | beam.Reshuffle()
          | beam.Map(lambda x, d, t: '%d:%s:%d' % (x, d.get(x, '-'), x * t),
                     d=beam.pvalue.AsDict(names), t=beam.pvalue.AsSingleton(total)))


def unbounded(p, sleep_ms):
  """A streaming job that runs for two minutes: PeriodicImpulse every 0.2 s,
  keyed, in 2 s fixed windows, counted per key."""
  del sleep_ms
  from apache_beam.transforms import window
  from apache_beam.transforms.periodicsequence import PeriodicImpulse
  now = time.time()
  return (p
          | PeriodicImpulse(start_timestamp=now, stop_timestamp=now + 120, fire_interval=0.2)
          | beam.Map(lambda t: ('k%d' % (int(t * 5) % 4), 1))
          | beam.WindowInto(window.FixedWindows(2))
          | beam.CombinePerKey(sum)
          | beam.MapTuple(lambda k, n: '%s:%d' % (k, n)))


PIPELINES = {f.__name__: f for f in (keyed, stateful, side_input, unbounded)}


def main(argv):
  parser = argparse.ArgumentParser()
  parser.add_argument('name', choices=sorted(PIPELINES))
  parser.add_argument('--output', required=True)
  parser.add_argument('--sleep_ms', type=int, default=0)
  args, beam_args = parser.parse_known_args(argv)
  # The job's messages (Beam logs them at INFO), for the tests to read.
  logging.getLogger().setLevel(logging.INFO)
  p = beam.Pipeline(options=PipelineOptions(beam_args))
  _ = PIPELINES[args.name](p, args.sleep_ms) | beam.io.WriteToText(args.output)
  result = p.run()
  state = result.wait_until_finish()
  print('PIPELINE STATE: %s' % state)
  # User counters, summed over every worker (the tests read these lines).
  from apache_beam.metrics.metric import MetricsFilter
  for c in result.metrics().query(MetricsFilter().with_namespace('cluster'))['counters']:
    print('COUNTER %s=%s' % (c.key.metric.name, c.committed if c.committed is not None else c.attempted))
  return 0 if str(state).split('.')[-1] == 'DONE' else 4


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
