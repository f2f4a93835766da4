"""A streaming job that would run for two minutes unless drained: a
PeriodicImpulse firing every 0.5 s, counted in 1-second fixed windows, each
count appended to a file as `window_start count`.

    python pipelines_drain.py OUTPUT_FILE --runner=PortableRunner ...
"""

import sys
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse


class AppendLine(beam.DoFn):
  def __init__(self, path):
    self.path = path

  def process(self, kv, w=beam.DoFn.WindowParam):
    with open(self.path, 'a') as f:
      f.write('%s %d\n' % (float(w.start), kv[1]))


def main(argv):
  output, beam_args = argv[0], argv[1:]
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
