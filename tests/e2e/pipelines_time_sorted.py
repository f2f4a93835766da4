"""A stateful DoFn that requires time-sorted input, as Java's
`@RequiresTimeSortedInput` reaches a runner: Python 2.77 has no such
annotation, so this script marks the DoFn's `ParDoPayload` with
`requires_time_sorted_input` and adds the pipeline requirement
`beam:requirement:pardo:time_sorted_input:v1`, exactly as Beam's Java SDK
does. The runner must give each key's elements in timestamp order.

    python pipelines_time_sorted.py PREFIX [--stream] [beam options...]

The DoFn remembers the last value per key and writes `KEY VALUE after
PREVIOUS` lines to files PREFIX-<uuid>-of-stream. The input holds values
1..N per key with timestamp = value, given in reverse order; without
--stream a batch Create, with it a TestStream that advances the watermark
midway (allowed lateness 1 hour keeps the later, older elements).
"""

import sys

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.options.pipeline_options import PortableOptions
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.portability.portable_runner import PortableRunner
from apache_beam.transforms import environments
from apache_beam.transforms import userstate
from apache_beam.transforms import window as bw

import pipelines_streaming as ps

TIME_SORTED_INPUT = 'beam:requirement:pardo:time_sorted_input:v1'
LAST = userstate.ReadModifyWriteStateSpec('last', VarIntCoder())
N = 300
EVENTS = [(k, v, v) for v in range(N, 0, -1) for k in ('a', 'b')]


class AfterLast(beam.DoFn):
  """`KEY VALUE after PREVIOUS` (0 for a key's first element)."""
  def process(self, kv, last=beam.DoFn.StateParam(LAST)):
    key, value = kv
    previous = last.read() or 0
    last.write(value)
    yield '%s %d after %d' % (key, value, previous)


def build(p, stream):
  if stream:
    half = len(EVENTS) // 2
    source = (p
              | ps._stream([('e', EVENTS[:half]), ('w', N // 2), ('e', EVENTS[half:]), ('end',)])
              | beam.WindowInto(bw.GlobalWindows(), allowed_lateness=3600))
  else:
    source = (p
              | beam.Create(EVENTS)
              | beam.Map(lambda e: bw.TimestampedValue((e[0], e[1]), e[2])))
  return source | 'Sorted' >> beam.ParDo(AfterLast())


def main(argv):
  prefix, args = argv[0], argv[1:]
  stream = '--stream' in args
  if stream:
    args.remove('--stream')
    args.append('--streaming')
  options = PipelineOptions(args)
  p = beam.Pipeline(options=options)
  _ = build(p, stream) | 'Write' >> beam.ParDo(ps.WriteLines(prefix))
  proto = p.to_runner_api(
      default_environment=environments.Environment.from_options(
          options.view_as(PortableOptions)))
  marked = 0
  for t in proto.components.transforms.values():
    if t.spec.urn != 'beam:transform:pardo:v1':
      continue
    payload = beam_runner_api_pb2.ParDoPayload.FromString(t.spec.payload)
    if payload.state_specs:
      payload.requires_time_sorted_input = True
      t.spec.payload = payload.SerializeToString()
      marked += 1
  assert marked == 1, marked
  proto.requirements.append(TIME_SORTED_INPUT)
  state = PortableRunner().run_portable_pipeline(proto, options).wait_until_finish()
  print('PIPELINE STATE: %s' % state)
  return 0 if str(state).endswith('DONE') else 1


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
