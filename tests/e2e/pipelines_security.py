"""Pipelines for the security tests (test_security.py), runnable as a script
the same way as pipelines.py (whose main() this reuses):

    python pipelines_security.py NAME --output PREFIX [--error_file PATH] [beam options...]
"""

import sys
import time

import apache_beam as beam

import pipelines


def isolated(p):
  """2,000 output lines, each reading a side input, slow enough (about 20 s)
  for another client to try to reach the job's workers meanwhile."""
  side = p | 'Side' >> beam.Create(['secret-side-input'])

  def use(x, s):
    if x % 100 == 0:
      time.sleep(1)
    return '%d %s' % (x, s[0])

  return (p
          | 'Main' >> beam.Create(list(range(2000)))
          | 'Shuffle' >> beam.Reshuffle()
          | 'Use' >> beam.Map(use, s=beam.pvalue.AsList(side)))


def setup_boom(p):
  """A DoFn whose setup raises, so every bundle of its stage fails before
  the SDK reads any of the bundle's data."""
  class Boom(beam.DoFn):
    def setup(self):
      raise ValueError('weir-setup-boom')

    def process(self, x):
      yield str(x)

  return p | beam.Create([1, 2, 3]) | 'Boom' >> beam.ParDo(Boom())


PIPELINES = {f.__name__: f for f in (isolated, setup_boom)}


if __name__ == '__main__':
  pipelines.PIPELINES.update(PIPELINES)
  sys.exit(pipelines.main(sys.argv[1:]))
