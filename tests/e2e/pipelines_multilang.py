"""Python pipelines with Java steps for test_multilang.py and bench/multilang.py.

  python pipelines_multilang.py xlang --expansion_service HOST:PORT --output DIR [beam options]

One pipeline, two SDKs: Java's GenerateSequence(0, N) (longs, beam:coder:varint:v1) feeds a
Python Map; Python rows (with a bytes field) go through a Java SqlTransform query (rows,
beam:coder:row:v1) and back to Python. Writes DIR/squares-* and DIR/sql-*, and DIR/coders.json:
the coder URNs of the PCollections that cross from one environment to the other in the pipeline
proto submitted to the runner.

  python pipelines_multilang.py count --expansion_service HOST:PORT|none --n N [beam options]

The benchmark: GenerateSequence(0, N) (Java; with `none`, Python's own Impulse + FlatMap(range)
and a Reshuffle instead) -> Python Map(x * 3) -> CombineGlobally(sum) and Count; prints
`count=N sum=S`.
"""

import argparse
import json
import os
import sys
import typing

import apache_beam as beam
from apache_beam.io.external.generate_sequence import GenerateSequence
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.sql import SqlTransform

SqlRow = typing.NamedTuple(
    'SqlRow', [('id', int), ('name', str), ('payload', bytes)])
beam.coders.registry.register_coder(SqlRow, beam.coders.RowCoder)

N_SQUARES = 25


def crossing_coders(pipeline_proto):
  """{pcollection unique name: coder URN} for PCollections produced in one
  environment and consumed in another."""
  comps = pipeline_proto.components
  producer_env, consumer_envs = {}, {}
  for t in comps.transforms.values():
    if t.subtransforms or not t.environment_id:
      continue
    for pc in t.outputs.values():
      producer_env[pc] = t.environment_id
    for pc in t.inputs.values():
      consumer_envs.setdefault(pc, set()).add(t.environment_id)
  crossing = {}
  for pc, env in producer_env.items():
    if any(e != env for e in consumer_envs.get(pc, ())):
      coll = comps.pcollections[pc]
      crossing[coll.unique_name] = comps.coders[coll.coder_id].spec.urn
  return crossing


def xlang(args, beam_args):
  options = PipelineOptions(beam_args)
  p = beam.Pipeline(options=options)
  squares = (
      p
      | 'Java GenerateSequence' >> GenerateSequence(
          start=0, stop=N_SQUARES, expansion_service=args.expansion_service)
      | 'Python square' >> beam.Map(lambda x: '%d %d' % (x, x * x)))
  _ = squares | 'Write squares' >> beam.io.WriteToText(
      os.path.join(args.output, 'squares'))
  rows = p | 'Python rows' >> beam.Create(
      [SqlRow(i, 'n%d' % i, bytes([i, 255 - i])) for i in range(6)])
  sql = rows | 'Java SQL' >> SqlTransform(
      "SELECT id * 10 AS id10, UPPER(name) AS name, payload "
      "FROM PCOLLECTION WHERE id <> 3",
      expansion_service=args.expansion_service)
  _ = (
      sql
      | 'Python format' >> beam.Map(
          lambda r: '%d %s %s' % (r.id10, r.name, r.payload.hex()))
      | 'Write sql' >> beam.io.WriteToText(os.path.join(args.output, 'sql')))
  with open(os.path.join(args.output, 'coders.json'), 'w') as f:
    json.dump(crossing_coders(p.to_runner_api()), f)
  result = p.run()
  result.wait_until_finish()
  assert result.state == 'DONE', result.state


def count(args, beam_args):
  options = PipelineOptions(beam_args)
  with beam.Pipeline(options=options) as p:
    if args.expansion_service == 'none':
      numbers = (
          p
          | beam.Impulse()
          | 'Python range' >> beam.FlatMap(lambda _: range(args.n))
          | beam.Reshuffle())
    else:
      numbers = p | 'Java GenerateSequence' >> GenerateSequence(
          start=0, stop=args.n, expansion_service=args.expansion_service)
    tripled = numbers | 'Python Map' >> beam.Map(lambda x: x * 3)
    total = tripled | beam.CombineGlobally(sum)
    n = tripled | beam.combiners.Count.Globally()
    _ = (
        total
        | beam.Map(lambda s, c: print('count=%d sum=%d' % (c, s), flush=True),
                   c=beam.pvalue.AsSingleton(n)))


def main(argv):
  parser = argparse.ArgumentParser()
  parser.add_argument('pipeline', choices=['xlang', 'count'])
  parser.add_argument('--expansion_service', required=True)
  parser.add_argument('--output')
  parser.add_argument('--n', type=int, default=1000000)
  args, beam_args = parser.parse_known_args(argv)
  {'xlang': xlang, 'count': count}[args.pipeline](args, beam_args)


if __name__ == '__main__':
  main(sys.argv[1:])
