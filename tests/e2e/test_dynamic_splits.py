"""Dynamic work rebalancing: a running bundle of several elements whose SDK
harness could start another bundle has its data channel split
(`ProcessBundleSplitRequest`, `channel_splits` at an element boundary); the
elements the SDK had not started run as a bundle of their own, in parallel,
and the output is exactly DirectRunner's. The same holds for a batch
splittable DoFn's restrictions, which go out as one bundle.

A server of its own runs with one timely worker (`--workers 1`) or two:
either way the 60 slow elements of `slow_elements` (under 1 KiB) reach one
bundle (a stage spreads its input over timely workers in 16 KiB chunks)
while the LOOPBACK harness has room for more (one harness, two bundles per
core: its residual runs beside it in the client's interpreter).
"""

import os
import re

import pytest

from conftest import start_weir_serve, serving


@pytest.fixture(params=['1', '2'])
def split_server(tmp_path, request):
  env = dict(os.environ, RUST_LOG='info', NO_COLOR='1')
  server = start_weir_serve(
      tmp_path / 'weir-splits.log',
      ['--bind', '127.0.0.1', '--staging_dir', tmp_path / 'staging', '--workers', request.param],
      env=env)
  server.workers = request.param
  with serving(server):
    yield server


def test_a_bundle_of_slow_elements_splits_its_channel_and_matches_direct_runner(
    tmp_path, split_server):
  from conftest import Beam
  direct = Beam(tmp_path / 'direct', lambda: None)
  expected = direct.run_named('slow_elements', 'DIRECT')
  assert expected.returncode == 0, expected.describe()
  _, want = expected.output()
  assert sum(want.values()) == 60

  beam = Beam(tmp_path / 'weir', lambda: split_server)
  run = beam.run_named('slow_elements', 'LOOPBACK')
  assert run.returncode == 0, run.describe(split_server)
  _, got = run.output()
  assert got == want, (
      'output differs from DirectRunner\n  missing: %s\n  unexpected: %s' %
      (sorted(want - got)[:5], sorted(got - want)[:5]))

  log = split_server.log_path.read_text(errors='replace')
  splits = [(int(n), int(of)) for n, of in re.findall(
      r'split off 0 residual restriction\(s\) and (\d+) input element\(s\) of (\d+)', log)]
  assert splits and all(0 < n < of for n, of in splits), (
      'no split of the data channel:\n' + log[-3000:])
  # All 60 went to one bundle, whatever the number of timely workers.
  assert splits[0][1] == 60, splits


def test_a_bundle_of_restrictions_splits_for_an_idle_core_and_matches_direct_runner(
    tmp_path, split_server):
  """A batch job's splittable DoFn whose SDK harnesses are Python processes
  of their own (PROCESS, one per core) gets the restrictions pending on a
  timely worker as one bundle (the SDK flushes once, as on DirectRunner);
  with one timely worker all six reach one bundle, and the split for an
  idle core (the other harness, or its own, which the sleeping claims leave
  partly idle) hands back restrictions the SDK had not started."""
  from conftest import Beam
  direct = Beam(tmp_path / 'direct', lambda: None)
  expected = direct.run_named('sdf_restrictions', 'DIRECT')
  assert expected.returncode == 0, expected.describe()
  _, want = expected.output()
  assert sum(want.values()) == 900

  beam = Beam(tmp_path / 'weir', lambda: split_server)
  run = beam.run_named('sdf_restrictions', 'PROCESS')
  assert run.returncode == 0, run.describe(split_server)
  _, got = run.output()
  assert got == want, (
      'output differs from DirectRunner\n  missing: %s\n  unexpected: %s' %
      (sorted(want - got)[:5], sorted(got - want)[:5]))

  log = split_server.log_path.read_text(errors='replace')
  splits = [(int(r), int(n), int(of)) for r, n, of in re.findall(
      r'split off (\d+) residual restriction\(s\) and (\d+) input element\(s\) of (\d+)', log)]
  if split_server.workers == '1':
    # One bundle of all six restrictions, split at a restriction boundary
    # (or inside the one running, with those after it).
    assert splits and splits[0][2] == 6 and splits[0][1] > 0, (
        'no split of the bundle of restrictions:\n' + log[-3000:])
  else:
    # Two timely workers: three restrictions each, two bundles, one on each
    # harness; neither is idle, but the sleeping claims leave each core
    # partly idle, so a bundle splits for its own harness.
    assert splits and all(of <= 3 for _, _, of in splits), (
        'no split of a bundle of restrictions:\n' + log[-3000:])
