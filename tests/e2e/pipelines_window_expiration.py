"""A stateful DoFn with an on-window-expiration callback, as Java's
`@OnWindowExpiration` reaches a runner: Python 2.77 has no such annotation,
so this script builds a DoFn with a bag and an event-time timer `expiry`
(timer family `ts-expiry`) that it never sets, and marks that family in the Runner API proto
as the one to notify on window expiry
(`ParDoPayload.on_window_expiration_timer_family_spec`, plus the pipeline
requirement `beam:requirement:pardo:on_window_expiration:v1`), exactly as
Beam's Java SDK does for `@OnWindowExpiration`. The runner must fire it once
per key and window, with the window's state still there.

    python pipelines_window_expiration.py PREFIX [--stream] [beam options...]

Writes `expired KEY [values] WINDOW` lines to files PREFIX-<uuid>-of-stream.
Without --stream the input is a batch Create; with it, a TestStream that
advances the watermark past each window in turn.
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
from apache_beam.transforms.timeutil import TimeDomain

import pipelines_streaming as ps

ON_WINDOW_EXPIRATION = 'beam:requirement:pardo:on_window_expiration:v1'
BAG = userstate.BagStateSpec('bag', VarIntCoder())
EXPIRY = userstate.TimerSpec('expiry', TimeDomain.WATERMARK)
EVENTS = [('k', 1, 1), ('k', 2, 2), ('j', 7, 3), ('k', 5, 15), ('j', 8, 24)]


class BufferUntilExpiry(beam.DoFn):
  """Buffers values per key and window; emits them when the window expires."""
  def process(self, kv, bag=beam.DoFn.StateParam(BAG),
              unused_expiry=beam.DoFn.TimerParam(EXPIRY)):
    # The timer is declared (Python registers a timer family only for a
    # TimerParam) but never set: the runner fires it.
    bag.add(kv[1])

  @userstate.on_timer(EXPIRY)
  def expired(self, key=beam.DoFn.KeyParam, w=beam.DoFn.WindowParam,
              bag=beam.DoFn.StateParam(BAG)):
    yield 'expired %s %s %s' % (key, sorted(bag.read()), ps.fmt_window(w))


def build(p, stream):
  if stream:
    source = p | ps._stream([
        ('e', EVENTS[:3]), ('w', 12), ('e', EVENTS[3:4]), ('w', 22),
        ('e', EVENTS[4:]), ('end',)])
  else:
    source = (p
              | beam.Create(EVENTS)
              | beam.Map(lambda e: bw.TimestampedValue((e[0], e[1]), e[2])))
  return (source
          | 'Window' >> beam.WindowInto(bw.FixedWindows(10))
          | 'Buffer' >> beam.ParDo(BufferUntilExpiry()))


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
    # Python names a timer's family 'ts-' + the timer's name.
    if 'ts-expiry' in payload.timer_family_specs:
      payload.on_window_expiration_timer_family_spec = 'ts-expiry'
      t.spec.payload = payload.SerializeToString()
      marked += 1
  assert marked == 1, marked
  proto.requirements.append(ON_WINDOW_EXPIRATION)
  state = PortableRunner().run_portable_pipeline(proto, options).wait_until_finish()
  print('PIPELINE STATE: %s' % state)
  return 0 if str(state).endswith('DONE') else 1


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
