"""Hostile Prepare requests, sent raw over the Job API: cyclic and deep
coders and composites are refused as INVALID_ARGUMENT naming the coder or
transform, in bounded time; requests over a resource limit are refused
naming the limit and the `weir serve` flag that raises it. After each, the
same server runs a valid job to DONE."""

import collections
import os
import subprocess
import sys
import time
import uuid

import grpc
import pytest
from apache_beam.portability.api import beam_job_api_pb2
from apache_beam.portability.api import beam_job_api_pb2_grpc
from apache_beam.portability.api import beam_runner_api_pb2
from google.protobuf import struct_pb2

from conftest import WEIR_BIN, start_weir_serve, serving

BYTES = 'beam:coder:bytes:v1'
KV = 'beam:coder:kv:v1'
IMPULSE = 'beam:transform:impulse:v1'


def pipeline_with(coders=(), transforms=(), roots=()):
  """A pipeline: one Impulse (root 'impulse') plus the given coders
  ({id: (urn, [components])}) and transforms ({id: (name, [subtransforms])})."""
  p = beam_runner_api_pb2.Pipeline()
  c = p.components
  c.coders['bytes'].spec.urn = BYTES
  c.windowing_strategies['ws'].window_coder_id = 'gw'
  c.coders['gw'].spec.urn = 'beam:coder:global_window:v1'
  c.pcollections['out'].coder_id = 'bytes'
  c.pcollections['out'].windowing_strategy_id = 'ws'
  imp = c.transforms['impulse']
  imp.unique_name = 'Impulse'
  imp.spec.urn = IMPULSE
  imp.outputs['out'] = 'out'
  for cid, (urn, comps) in dict(coders).items():
    c.coders[cid].spec.urn = urn
    c.coders[cid].component_coder_ids.extend(comps)
  for tid, (name, subs) in dict(transforms).items():
    c.transforms[tid].unique_name = name
    c.transforms[tid].subtransforms.extend(subs)
  p.root_transform_ids.extend(['impulse'] + list(roots))
  return p


def prepare(server, pipeline, options=None, timeout=30):
  with grpc.insecure_channel(
      server.endpoint,
      options=[('grpc.max_send_message_length', 1 << 30)]) as channel:
    stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
    return stub.Prepare(
        beam_job_api_pb2.PrepareJobRequest(
            pipeline=pipeline, job_name='hostile',
            pipeline_options=options or struct_pb2.Struct()),
        timeout=timeout)


def refused(server, pipeline, options=None):
  """The (code, details) of a Prepare that must fail, and how long it took."""
  start = time.time()
  with pytest.raises(grpc.RpcError) as e:
    prepare(server, pipeline, options)
  return e.value.code(), e.value.details(), time.time() - start


def chain(n):
  coders = {'c0': (BYTES, [])}
  for i in range(1, n):
    coders['c%d' % i] = (KV, ['bytes', 'c%d' % (i - 1)])
  return coders


HOSTILE = {
    'self_coder': (
        pipeline_with(coders={'me': (KV, ['bytes', 'me'])}),
        'coder "me" is its own component (coder cycle me -> me)'),
    'mutual_coders': (
        pipeline_with(coders={'a': (KV, ['bytes', 'b']), 'b': (KV, ['bytes', 'a'])}),
        'coder "a" is its own component (coder cycle a -> b -> a)'),
    'coder_chain_10000': (
        pipeline_with(coders=chain(10000)),
        'nests more than 64 coders deep'),
    'shared_coder_dag_60': (
        pipeline_with(coders=dict(
            [('d0', (BYTES, []))] +
            [('d%d' % i, (KV, ['d%d' % (i - 1)] * 2)) for i in range(1, 60)])),
        'coder "d13" expands to more than 10000 coders'),
    'self_listing_composite': (
        pipeline_with(transforms={'loop': ('Loop', ['loop'])}, roots=['loop']),
        'transform loop (Loop) is its own subtransform'),
    'composite_cycle_of_three': (
        pipeline_with(
            transforms={'a': ('A', ['b']), 'b': ('B', ['c']), 'c': ('C', ['a'])},
            roots=['a']),
        'transform a (A) is its own subtransform (composite cycle a (A) -> b (B) -> c (C) -> a (A))'),
    'composite_nesting_5000': (
        pipeline_with(
            transforms=dict(
                [('t%d' % i, ('Nest%d' % i, ['t%d' % (i + 1)])) for i in range(5000)] +
                [('t5000', ('Nest5000', []))]),
            roots=['t0']),
        'transform t256 (Nest256) nests more than 256 composites deep'),
    # 25000 leaves and the base pipeline's Impulse.
    'leaf_transforms_25000': (
        pipeline_with(
            transforms=dict(('t%d' % i, ('T%d' % i, [])) for i in range(25000)),
            roots=['t%d' % i for i in range(25000)]),
        "the number of the pipeline's leaf transforms (those without subtransforms) is 25001, "
        "over this server's limit of 20000 (weir serve --max_pipeline_transforms raises it)"),
}


@pytest.mark.parametrize('case', sorted(HOSTILE))
def test_hostile_pipeline_is_refused_by_name_then_a_job_runs(beam, weir_server, case):
  pipeline, expected = HOSTILE[case]
  code, details, took = refused(weir_server, pipeline)
  assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
  assert expected in details, details
  assert took < 10, 'Prepare took %.1f s' % took
  assert weir_server.alive(), weir_server.log_tail()
  good = beam.run_named('good', 'LOOPBACK')
  assert good.returncode == 0, good.describe(weir_server)
  _, lines = good.output()
  assert lines == collections.Counter({'x: 4': 1, 'y: 2': 1}), dict(lines)


def test_option_over_the_limit_is_refused_naming_it_and_the_flag(weir_server):
  options = struct_pb2.Struct()
  options['beam:option:huge:v1'] = 'x' * 2_000_000
  code, details, _ = refused(weir_server, pipeline_with(), options)
  assert code == grpc.StatusCode.INVALID_ARGUMENT, details
  assert details == (
      'pipeline option beam:option:huge:v1 is 2000004 bytes, over this '
      "server's limit of 1048576 bytes (weir serve --max_option_bytes raises it)"), details


def test_an_option_nested_40_deep_is_refused_and_get_jobs_still_answers(weir_server):
  """Found by the long fuzz run: a job whose option nested ~40 deep made
  every client's GetJobs fail to decode (prost's recursion limit)."""
  value = 'x'
  for _ in range(40):
    value = [value]
  options = struct_pb2.Struct()
  options['beam:option:deep:v1'] = value
  code, details, _ = refused(weir_server, pipeline_with(), options)
  assert code == grpc.StatusCode.INVALID_ARGUMENT, details
  assert details == ('pipeline option beam:option:deep:v1 nests lists and structs '
                     '41 deep, more than the 32 Weir takes'), details
  jobs = subprocess.run([str(WEIR_BIN), 'jobs', '--endpoint', weir_server.endpoint, 'list'],
                        capture_output=True, text=True, timeout=60)
  assert jobs.returncode == 0, jobs.stderr


def test_a_refusal_quoting_a_200kb_value_is_shortened_so_clients_can_read_it(weir_server):
  """Found by the fuzzer: the refusal quoted the whole value, and gRPC
  clients drop responses whose metadata passes 8 KiB."""
  options = struct_pb2.Struct()
  options['beam:option:num_workers:v1'] = 'x' * 200_000
  code, details, _ = refused(weir_server, pipeline_with(), options)
  assert code == grpc.StatusCode.INVALID_ARGUMENT, details
  assert details.startswith('pipeline option --num_workers: expects an integer, got "xxx'), details[:200]
  assert details.endswith('xxx... (198009 more bytes)'), details[-200:]


def test_num_workers_over_the_harness_cap_is_refused(weir_server):
  options = struct_pb2.Struct()
  options['beam:option:num_workers:v1'] = 100000
  code, details, _ = refused(weir_server, pipeline_with(), options)
  assert code == grpc.StatusCode.INVALID_ARGUMENT, details
  assert 'pipeline option --num_workers' in details, details
  assert 'weir serve --max_sdk_harnesses_per_job raises it' in details, details


def test_staging_location_outside_the_root_is_refused(weir_server, tmp_path):
  options = struct_pb2.Struct()
  outside = tmp_path / 'elsewhere'
  options['beam:option:staging_location:v1'] = str(outside)
  code, details, _ = refused(weir_server, pipeline_with(), options)
  assert code == grpc.StatusCode.INVALID_ARGUMENT, details
  assert details.startswith(
      'pipeline option --staging_location: %s: outside this server\'s staging root ' % outside), details
  assert 'weir serve --allow_client_staging_locations lets clients choose' in details, details
  assert not outside.exists()


@pytest.fixture
def small_server(tmp_path):
  """A server of its own with small limits: 2 prepared jobs living 3 s,
  pipelines of at most 4 KiB."""
  server = start_weir_serve(
      tmp_path / 'weir-small.log',
      ['--staging_dir', tmp_path / 'staging', '--max_prepared_jobs', '2',
       '--prepared_job_ttl_secs', '3', '--max_pipeline_bytes', '4096',
       '--max_artifact_bytes_per_job', '1000'])
  with serving(server):
    yield server


def _job_ids(server):
  with grpc.insecure_channel(server.endpoint) as channel:
    jobs = beam_job_api_pb2_grpc.JobServiceStub(channel).GetJobs(
        beam_job_api_pb2.GetJobsRequest(), timeout=10)
  return {j.job_id for j in jobs.job_info}


def _with_dependency():
  """A pipeline whose environment has one file to stage."""
  from apache_beam.portability import common_urns
  p = pipeline_with()
  env = p.components.environments['env']
  env.urn = common_urns.environments.EXTERNAL.urn
  dep = env.dependencies.add()
  dep.type_urn = common_urns.artifact_types.FILE.urn
  dep.type_payload = beam_runner_api_pb2.ArtifactFilePayload(path='/big').SerializeToString()
  dep.role_urn = common_urns.artifact_roles.STAGING_TO.urn
  return p


def test_pipeline_size_and_prepared_jobs_are_capped_and_expire(small_server):
  code, details, _ = refused(small_server, pipeline_with(coders=chain(300)))
  assert code == grpc.StatusCode.INVALID_ARGUMENT, details
  assert 'over this server\'s limit of 4096 bytes (weir serve --max_pipeline_bytes raises it)' in details, details
  first = prepare(small_server, pipeline_with()).preparation_id
  second = prepare(small_server, pipeline_with()).preparation_id
  # At the cap, the oldest prepared job no client stages makes room.
  third = prepare(small_server, pipeline_with()).preparation_id
  assert _job_ids(small_server) == {second, third}
  time.sleep(3.5)
  # Expired: room again, and the old jobs are gone.
  fourth = prepare(small_server, pipeline_with()).preparation_id
  assert _job_ids(small_server) == {fourth}


@pytest.fixture
def two_prepared_server(tmp_path):
  """A server of its own that holds 2 prepared jobs (for an hour)."""
  server = start_weir_serve(
      tmp_path / 'weir-two-prepared.log',
      ['--staging_dir', tmp_path / 'staging', '--max_prepared_jobs', '2'])
  with serving(server):
    yield server


def test_prepared_jobs_staging_their_artifacts_are_kept_at_the_cap(two_prepared_server):
  """While both held jobs stage artifacts, a third Prepare is refused."""
  server = two_prepared_server
  import queue
  from apache_beam.portability.api import beam_artifact_api_pb2
  from apache_beam.portability.api import beam_artifact_api_pb2_grpc
  # The first is idle, so the third Prepare below forgets it.
  idle = prepare(server, pipeline_with()).preparation_id
  staging = []
  with grpc.insecure_channel(server.endpoint) as channel:
    stub = beam_artifact_api_pb2_grpc.ArtifactStagingServiceStub(channel)
    for _ in range(2):
      token = prepare(server, _with_dependency()).staging_session_token
      out = queue.Queue()
      def answers(token=token, out=out):
        yield beam_artifact_api_pb2.ArtifactResponseWrapper(staging_token=token)
        # Never answer: staging stays open.
        out.get()
      responses = stub.ReverseArtifactRetrievalService(answers(), timeout=30)
      next(responses)  # the server asks to resolve the artifact: staging is open
      staging.append((token, out, responses))
    assert idle not in _job_ids(server)
    code, details, _ = refused(server, pipeline_with())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    assert details.startswith('the number of prepared jobs not yet run, with this one, all staging their artifacts'), details
    assert 'is 3, over this server\'s limit of 2 (weir serve --max_prepared_jobs raises it)' in details, details
    assert _job_ids(server) == {t for t, _, _ in staging}
    for _, out, responses in staging:
      out.put(None)
      responses.cancel()
  assert server.alive()


def _stage(server, token, chunks):
  """Answers a staging stream for a _with_dependency() job: its one
  artifact is `chunks` (bytes each). Raises the stream's error."""
  import queue
  from apache_beam.portability.api import beam_artifact_api_pb2
  from apache_beam.portability.api import beam_artifact_api_pb2_grpc

  def answers(requests):
    yield beam_artifact_api_pb2.ArtifactResponseWrapper(staging_token=token)
    for r in requests:
      if r.HasField('resolve_artifact'):
        yield beam_artifact_api_pb2.ArtifactResponseWrapper(
            resolve_artifact_response=beam_artifact_api_pb2.ResolveArtifactsResponse(
                replacements=list(r.resolve_artifact.artifacts)))
      else:
        for data in chunks:
          yield beam_artifact_api_pb2.ArtifactResponseWrapper(
              get_artifact_response=beam_artifact_api_pb2.GetArtifactResponse(data=data))
        yield beam_artifact_api_pb2.ArtifactResponseWrapper(is_last=True)

  with grpc.insecure_channel(server.endpoint) as channel:
    stub = beam_artifact_api_pb2_grpc.ArtifactStagingServiceStub(channel)
    out = queue.Queue()
    try:
      for r in stub.ReverseArtifactRetrievalService(answers(iter(out.get, None)), timeout=20):
        out.put(r)
    finally:
      out.put(None)


def test_artifacts_over_the_limit_stop_staging(small_server):
  token = prepare(small_server, _with_dependency()).staging_session_token
  with pytest.raises(grpc.RpcError) as e:
    _stage(small_server, token, [b'x' * 600] * 3)
  assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
  assert 'weir serve --max_artifact_bytes_per_job raises it' in e.value.details(), e.value.details()
  assert small_server.alive()


def _field(number, payload):
  """A length-delimited protobuf field."""
  def varint(n):
    out = b''
    while True:
      b, n = n & 0x7f, n >> 7
      out += bytes([b | (0x80 if n else 0)])
      if not n:
        return out
  return varint(number << 3 | 2) + varint(len(payload)) + payload


def test_a_request_nested_past_the_decoders_limit_is_invalid_argument(weir_server):
  # prost decodes at most 100 nested messages; deeper is the client's fault.
  # Python's protobuf will not build it, so the bytes are written by hand:
  # Struct{fields: {"k": Value{struct_value: Struct{...}}}} 120 deep.
  struct = b''
  for _ in range(120):
    value = _field(5, struct)  # Value.struct_value
    struct = _field(1, _field(1, b'k') + _field(2, value))  # Struct.fields entry
  request = _field(2, struct)  # PrepareJobRequest.pipeline_options
  with grpc.insecure_channel(weir_server.endpoint) as channel:
    prepare_raw = channel.unary_unary(
        '/org.apache.beam.model.job_management.v1.JobService/Prepare')
    with pytest.raises(grpc.RpcError) as e:
      prepare_raw(request, timeout=30)
  code, details = e.value.code(), e.value.details()
  assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
  assert details.startswith('failed to decode Protobuf message: '), details
  assert details.endswith('recursion limit reached'), details
  assert weir_server.alive()


def test_the_bytes_of_prepared_pipelines_are_capped(tmp_path):
  """Prepared jobs not yet run hold their pipelines: past
  --max_held_pipeline_bytes in all, Prepare is RESOURCE_EXHAUSTED (one
  client could otherwise pin max_prepared_jobs x max_pipeline_bytes)."""
  size = len(pipeline_with().SerializeToString())
  server = start_weir_serve(
      tmp_path / 'weir-held.log',
      ['--staging_dir', tmp_path / 'staging', '--max_held_pipeline_bytes', str(2 * size + size // 2)])
  with serving(server):
    prepare(server, pipeline_with())
    prepare(server, pipeline_with())
    code, details, _ = refused(server, pipeline_with())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    assert details.startswith('the serialized pipelines of the prepared jobs not yet run'), details
    assert 'is %d bytes, over this server\'s limit of %d bytes (weir serve --max_held_pipeline_bytes raises it)' % (
        3 * size, 2 * size + size // 2) in details, details
