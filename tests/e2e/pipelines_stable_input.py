"""A ParDo marked `requires_stable_input` (Java's @RequiresStableInput,
`beam:requirement:pardo:stable_input:v1`) downstream of a step that tags each
element with a random id. The marked DoFn records every element it sees
(`seen.txt` next to the output) and fails the first time it sees element 3,
so the runner retries that bundle. Python has no annotation for it; the
proto is marked as Beam's Java SDK marks it.

Usage: pipelines_stable_input.py OUTPUT_PREFIX [beam options]"""

import os
import sys
import uuid

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, PortableOptions
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.portability import portable_runner
from apache_beam.transforms import environments

STABLE_INPUT = 'beam:requirement:pardo:stable_input:v1'


class RecordAndFailOnce(beam.DoFn):
  def __init__(self, folder):
    self._folder = folder

  def process(self, tagged):
    with open(os.path.join(self._folder, 'seen.txt'), 'a') as f:
      f.write(tagged + '\n')
    marker = os.path.join(self._folder, 'failed-once')
    if tagged.startswith('3:') and not os.path.exists(marker):
      open(marker, 'w').close()
      raise RuntimeError('weir-stable-input: first attempt fails')
    yield tagged


def main(argv):
  prefix, args = argv[0], argv[1:]
  folder = os.path.dirname(os.path.abspath(prefix))
  options = PipelineOptions(args)
  p = beam.Pipeline(options=options)
  _ = (p
       | beam.Create(list(range(20)))
       | 'Tag' >> beam.Map(lambda x: '%d:%s' % (x, uuid.uuid4().hex))
       | 'Stable' >> beam.ParDo(RecordAndFailOnce(folder))
       | 'Write' >> beam.io.WriteToText(prefix))
  proto = p.to_runner_api(
      default_environment=environments.Environment.from_options(
          options.view_as(PortableOptions)))
  marked = 0
  for t in proto.components.transforms.values():
    if t.spec.urn == 'beam:transform:pardo:v1' and t.unique_name.endswith('Stable'):
      payload = beam_runner_api_pb2.ParDoPayload.FromString(t.spec.payload)
      payload.requires_stable_input = True
      t.spec.payload = payload.SerializeToString()
      marked += 1
  assert marked == 1, marked
  proto.requirements.append(STABLE_INPUT)
  runner = portable_runner.PortableRunner()
  state = runner.run_portable_pipeline(proto, options).wait_until_finish()
  print('PIPELINE STATE: %s' % state)
  return 0 if str(state).endswith('DONE') else 1


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
