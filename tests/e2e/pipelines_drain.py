"""Streaming jobs that would run for minutes unless drained.

    python pipelines_drain.py OUTPUT_FILE [--counter] --runner=PortableRunner ...

By default a PeriodicImpulse firing every 0.5 s, counted in 1-second fixed
windows, each count appended to OUTPUT_FILE as `window_start count`.

With --counter, an unbounded splittable DoFn (`Counter`) that emits one
position every 0.2 s (checkpointing with a resume delay in between), each
appended as `position before|after`: `after` when the restriction it came
from was truncated by its `truncate_restriction`, which on drain keeps three
more positions.
"""

import sys
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window
from apache_beam.io.restriction_trackers import OffsetRange
from apache_beam.io.restriction_trackers import OffsetRestrictionTracker
from apache_beam.transforms.core import RestrictionProvider
from apache_beam.transforms.periodicsequence import PeriodicImpulse
from apache_beam.utils.timestamp import Duration


class AppendLine(beam.DoFn):
  def __init__(self, path):
    self.path = path

  def process(self, kv, w=beam.DoFn.WindowParam):
    with open(self.path, 'a') as f:
      f.write('%s %d\n' % (float(w.start), kv[1]))


UNBOUNDED = 10**12


class CounterRestrictions(RestrictionProvider):
  """Positions [0, UNBOUNDED); truncated on drain to the next three."""
  def initial_restriction(self, element):
    return OffsetRange(0, UNBOUNDED)

  def create_tracker(self, restriction):
    return OffsetRestrictionTracker(restriction)

  def restriction_size(self, element, restriction):
    return restriction.size()

  def truncate(self, element, restriction):
    return OffsetRange(
        restriction.start, min(restriction.stop, restriction.start + 3))


class Counter(beam.DoFn):
  """Claims one position per call, then asks to resume 0.2 s later."""
  def process(self, element, tracker=beam.DoFn.RestrictionParam(CounterRestrictions())):
    restriction = tracker.current_restriction()
    if tracker.try_claim(restriction.start):
      yield '%d %s' % (
          restriction.start, 'before' if restriction.stop == UNBOUNDED else 'after')
      tracker.defer_remainder(Duration.of(0.2))


class AppendText(beam.DoFn):
  def __init__(self, path):
    self.path = path

  def process(self, line):
    with open(self.path, 'a') as f:
      f.write(line + '\n')


def main(argv):
  output, beam_args = argv[0], argv[1:]
  if '--counter' in beam_args:
    beam_args.remove('--counter')
    with beam.Pipeline(options=PipelineOptions(beam_args + ['--streaming'])) as p:
      _ = p | beam.Impulse() | beam.ParDo(Counter()) | beam.ParDo(AppendText(output))
    return
  start = int(time.time()) + 1
  with beam.Pipeline(options=PipelineOptions(beam_args + ['--streaming'])) as p:
    _ = (
        p
        | PeriodicImpulse(
            start_timestamp=start, stop_timestamp=start + 120, fire_interval=0.5)
        | beam.Map(lambda t: ('k', 1))
        | beam.WindowInto(window.FixedWindows(1))
        | beam.CombinePerKey(sum)
        | beam.ParDo(AppendLine(output)))


if __name__ == '__main__':
  main(sys.argv[1:])
