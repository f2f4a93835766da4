"""Failures: a user DoFn error reaches the client; bad requests are refused."""

import collections
import re

import grpc
import pytest
from google.protobuf import struct_pb2

from conftest import ENVIRONMENTS

UNKNOWN_URN = 'beam:transform:weir_test_unknown:v1'


@pytest.mark.parametrize('env', ENVIRONMENTS)
def test_failing_dofn_fails_job_then_server_still_works(beam, weir_server, env):
  bad = beam.run_named('boom', env)
  assert bad.returncode != 0, (
      'a pipeline whose DoFn raises must fail\n' + bad.describe(weir_server))
  error = bad.client_error()
  assert error is not None, (
      'the client did not get an exception from wait_until_finish\n' +
      bad.describe(weir_server))
  assert 'weir-boom' in error, (
      'the error the client got does not carry the user error:\n%s\n%s' %
      (error[-3000:], bad.describe(weir_server)))
  assert weir_server.alive(), 'weir died after a failing job:\n' + (
      weir_server.log_tail())

  good = beam.run_named('good', env)
  assert good.returncode == 0, good.describe(weir_server)
  _, lines = good.output()
  assert lines == collections.Counter({'x: 4': 1, 'y: 2': 1}), (
      dict(lines), good.describe(weir_server))


@pytest.mark.parametrize('env', ENVIRONMENTS)
def test_failed_bundle_is_retried_without_duplicates(beam, weir_server, env):
  run = beam.run_named('flaky', env)
  assert run.returncode == 0, (
      'a bundle that fails once must be retried\n' + run.describe(weir_server))
  _, lines = run.output()
  assert lines == collections.Counter('v%d' % i for i in range(6)), (
      dict(lines), run.describe(weir_server))


def test_sdk_process_killed_mid_bundle_is_retried(beam, weir_server):
  run = beam.run_named('crash', 'PROCESS')
  assert run.returncode == 0, (
      'a bundle whose SDK harness died must be retried\n' + run.describe(weir_server))
  _, lines = run.output()
  assert lines == collections.Counter('c%d' % i for i in range(6)), (
      dict(lines), run.describe(weir_server))
  log = weir_server.log_tail(1000000)
  assert 'SDK harness is unhealthy' in log, weir_server.log_tail()
  # The dead harness is replaced, and the job's messages say so (the job
  # may end on the other harness before the replacement is up).
  assert re.search(r'SDK harness \S+ died \([^\n]*\); restarting it', run.stderr), (
      run.describe(weir_server))


@pytest.mark.parametrize('env', ENVIRONMENTS)
def test_cancel_stops_a_running_job(beam, weir_server, env):
  import time
  start = time.time()
  run = beam.run_named('slow', env, extra=['--cancel_after', '4'])
  elapsed = time.time() - start
  assert 'CANCELLED' in (run.stdout + run.stderr), run.describe(weir_server)
  assert elapsed < 45, 'cancel did not stop the 60 s DoFn (took %.0f s)' % elapsed
  assert weir_server.alive(), weir_server.log_tail()
  good = beam.run_named('good', env)
  assert good.returncode == 0, good.describe(weir_server)


def test_hot_key_is_reported_and_named_only_when_enabled(beam, weir_server):
  expected = collections.Counter(['hot: 3000'] + ['k%d: 20' % i for i in range(40)])
  quiet = beam.run_named('hot_key', 'LOOPBACK')
  assert quiet.returncode == 0, quiet.describe(weir_server)
  assert quiet.output()[1] == expected
  assert 'hot key in GroupByKey' in quiet.stderr, quiet.describe(weir_server)
  assert '"hot"' not in quiet.stderr, 'the key must not be shown without hot-key logging'

  loud = beam.run_named('hot_key', 'LOOPBACK', extra=['--dataflow_service_options=enable_hot_key_logging'])
  assert loud.returncode == 0, loud.describe(weir_server)
  assert 'hot key in GroupByKey' in loud.stderr and 'key "hot" has 3000 of the' in loud.stderr, (
      loud.describe(weir_server))


def test_an_even_sharded_group_by_key_has_no_hot_key(beam, weir_server):
  """Four keys of 2000 values each: two a worker, half each, which is the
  key count the pipeline chose, not a skew (WriteToText(num_shards=4) groups
  so, and Go's textio.Write on one key)."""
  run = beam.run_named('four_shards', 'LOOPBACK')
  assert run.returncode == 0, run.describe(weir_server)
  assert run.output()[1] == collections.Counter('shard%d: 2000' % i for i in range(4))
  assert 'hot key' not in run.stderr, run.describe(weir_server)


def _pipeline_with_unknown_leaf():
  """A real Impulse pipeline plus a leaf transform no runner knows."""
  import apache_beam as beam

  p = beam.Pipeline()
  _ = p | beam.Impulse()
  proto = p.to_runner_api()
  comps = proto.components
  impulse_ids = [
      tid for tid, t in comps.transforms.items()
      if t.spec.urn == 'beam:transform:impulse:v1'
  ]
  assert len(impulse_ids) == 1, proto
  impulse_out = list(comps.transforms[impulse_ids[0]].outputs.values())[0]

  out_id = 'weir_test_unknown_out'
  comps.pcollections[out_id].CopyFrom(comps.pcollections[impulse_out])
  comps.pcollections[out_id].unique_name = 'WeirTestUnknown.out'

  t = comps.transforms['weir_test_unknown']
  t.unique_name = 'WeirTestUnknown'
  t.spec.urn = UNKNOWN_URN
  t.inputs['in'] = impulse_out
  t.outputs['out'] = out_id
  proto.root_transform_ids.append('weir_test_unknown')
  return proto


def test_prepare_rejects_unknown_transform_urn(weir_server):
  from apache_beam.portability.api import beam_job_api_pb2
  from apache_beam.portability.api import beam_job_api_pb2_grpc

  request = beam_job_api_pb2.PrepareJobRequest(
      pipeline=_pipeline_with_unknown_leaf(),
      pipeline_options=struct_pb2.Struct(),
      job_name='weir-test-unknown-urn')
  with grpc.insecure_channel(weir_server.endpoint) as channel:
    stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
    with pytest.raises(grpc.RpcError) as info:
      stub.Prepare(request, timeout=30)
  err = info.value
  assert err.code() in (grpc.StatusCode.INVALID_ARGUMENT,
                        grpc.StatusCode.UNIMPLEMENTED), (err.code(), err.details())
  assert UNKNOWN_URN in (err.details() or ''), err.details()
  assert weir_server.alive(), weir_server.log_tail()


def test_harness_that_exits_at_start_fails_the_job_at_once(beam, weir_server, tmp_path):
  """A PROCESS command that exits before its SDK harness connects fails the
  job in seconds, and the job's error carries its exit status and output."""
  import json
  import sys
  import time
  from conftest import PIPELINES_PY
  boot = tmp_path / 'bad-boot.sh'
  boot.write_text('#!/bin/sh\necho "weir-test: no such SDK here" >&2\nexit 7\n')
  boot.chmod(0o755)
  out = tmp_path / 'out'
  began = time.monotonic()
  run = beam.run(
      [PIPELINES_PY, 'good', '--output', out, '--error_file', tmp_path / 'err.txt',
       '--runner=PortableRunner', '--job_endpoint=%s' % weir_server.endpoint,
       '--environment_type=PROCESS',
       '--environment_config=' + json.dumps({'command': str(boot)})],
      out, 'bad-boot', error_file=tmp_path / 'err.txt')
  took = time.monotonic() - began
  assert run.returncode != 0, run.describe(weir_server)
  assert took < 60, 'took %.0fs to fail\n%s' % (took, run.describe(weir_server))
  text = (run.client_error() or '') + run.stderr
  assert 'exited before it connected (exit status 7)' in text, run.describe(weir_server)
  assert 'weir-test: no such SDK here' in text, run.describe(weir_server)
  assert weir_server.alive(), weir_server.log_tail()
