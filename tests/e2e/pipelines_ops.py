"""Pipelines for the job-management end-to-end tests (test_ops.py), runnable
as a script:

    python pipelines_ops.py NAME --output PREFIX [--result_file PATH] [beam options...]

Builds pipeline NAME, writes its result with WriteToText(PREFIX), runs it and
waits. With --result_file, writes JSON there: the job's final state and the
user counters the client reads with `PipelineResult.metrics().query()`
(name -> committed value), plus how many counters, distributions and gauges
an unfiltered query returns. Exits 3 when the pipeline fails.
"""

import argparse
import json
import logging
import sys
import time

import apache_beam as beam
from apache_beam.io import WriteToText
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

# A module-level value the `staged` pipeline's workers read.
SESSION_GREETING = 'hello from the main session'


class FLAGS:
  marker = 'WEIR-LOG-MARKER'
  sleep = 0.0


class LogMarker(beam.DoFn):
  """Logs one marker line per element (the SDK harness sends it to Weir's
  Logging service) and counts elements."""
  def __init__(self, marker, sleep):
    self._marker = marker
    self._sleep = sleep
    self._count = Metrics.counter('ops', 'ops_elements')

  def process(self, x):
    time.sleep(self._sleep)
    logging.info('%s element=%s', self._marker, x)
    # A DoFn's print (the harness's stdout): Weir puts it in the job's logs.
    print('%s printed=%s' % (self._marker, x), flush=True)
    self._count.inc()
    yield 'logged %s' % x


def log_marker(p):
  """Four elements through a DoFn that logs a marker line for each (after
  --sleep seconds)."""
  return p | beam.Create([1, 2, 3, 4]) | beam.ParDo(LogMarker(FLAGS.marker, FLAGS.sleep))


def counters(p):
  """A user counter (incremented once per element, 10 elements) and a
  distribution, then a slow step so the job runs for a while."""
  dist = Metrics.distribution('ops', 'ops_sizes')
  count = Metrics.counter('ops', 'ops_counted')
  seconds = FLAGS.sleep

  def work(x):
    count.inc()
    dist.update(x)
    # Burn a little CPU so the SDK processes have something to show.
    total = 0
    deadline = time.time() + seconds
    while time.time() < deadline:
      total += sum(range(1000))
    return 'x%d' % x

  return p | beam.Create(list(range(10))) | 'Work' >> beam.Map(work)


def staged(p):
  """Create + Map over a module global; run it with --save_main_session so
  the SDK stages the pickled main session as an artifact."""
  return (
      p
      | beam.Create(['a', 'b'])
      | beam.Map(lambda x: '%s: %s' % (x, SESSION_GREETING)))


PIPELINES = {f.__name__: f for f in (log_marker, counters, staged)}


def main(argv):
  parser = argparse.ArgumentParser()
  parser.add_argument('name', choices=sorted(PIPELINES))
  parser.add_argument('--output', required=True)
  parser.add_argument('--result_file')
  parser.add_argument('--marker', default=FLAGS.marker)
  parser.add_argument('--sleep', type=float, default=0.0)
  known, beam_args = parser.parse_known_args(argv)
  FLAGS.marker = known.marker
  FLAGS.sleep = known.sleep
  p = beam.Pipeline(options=PipelineOptions(beam_args))
  # pylint: disable=expression-not-assigned
  PIPELINES[known.name](p) | WriteToText(known.output)
  result = p.run()
  state = result.wait_until_finish()
  if known.result_file:
    wanted = {}
    for name in ('ops_elements', 'ops_counted'):
      found = result.metrics().query(MetricsFilter().with_name(name))
      wanted[name] = sum(c.committed for c in found['counters'])
    everything = result.metrics().query()
    # The steps the user counters are keyed by, and what a filter by the
    # step's name finds (Dataflow and DirectRunner key them by step name).
    steps = sorted({r.key.step for r in everything['counters']
                    if r.key.metric.namespace == 'ops'})
    by_step = result.metrics().query(
        MetricsFilter().with_step('Work').with_namespace('ops'))['counters']
    weir = [
        '%s/%s' % (r.key.metric.namespace, r.key.metric.name)
        for kind in ('counters', 'gauges') for r in everything[kind]
        if r.key.metric.namespace == 'weir'
    ]
    with open(known.result_file, 'w', encoding='utf-8') as f:
      json.dump({
          'state': str(state),
          'counters': wanted,
          'weir_metrics': sorted(weir),
          'unfiltered': {k: len(v) for k, v in everything.items()},
          'steps': steps,
          'by_step': {'%s/%s' % (c.key.step, c.key.metric.name): c.committed for c in by_step},
      }, f)
  return 0 if str(state) == 'DONE' else 3


if __name__ == '__main__':
  logging.getLogger().setLevel(logging.INFO)
  sys.exit(main(sys.argv[1:]))
