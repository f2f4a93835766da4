"""Bounded memory: a job whose bundle outputs and GroupByKey outgrow the
runner's memory budget spills both to disk and gives DirectRunner's output.

A server of its own runs with `--gbk_memory_budget_mb=1`, so each output
stream of a bundle past 1 MiB goes to a spill file while the bundle runs,
and the GroupByKey writes sorted runs and merges them back.
"""

import os
import re

import pytest

from conftest import start_weir_serve, serving


@pytest.fixture
def budget_server(tmp_path):
  env = dict(os.environ,
             RUST_LOG='info,weir_engine::group_by_key=debug,weir_engine::operators::sdk_stage=debug',
             NO_COLOR='1')
  server = start_weir_serve(
      tmp_path / 'weir-budget.log',
      ['--bind', '127.0.0.1', '--staging_dir', tmp_path / 'staging',
       '--gbk_memory_budget_mb', '1', '--spill_dir', tmp_path / 'spill'],
      env=env)
  server.spill_dir = tmp_path / 'spill'
  with serving(server):
    yield server


def test_bundle_outputs_and_groups_spill_and_match_direct_runner(tmp_path, budget_server):
  from conftest import Beam
  direct = Beam(tmp_path / 'direct', lambda: None)
  expected = direct.run_named('fan_out_gbk', 'DIRECT')
  assert expected.returncode == 0, expected.describe()
  _, want = expected.output()
  assert sum(want.values()) == 20000, 'one line per key'

  beam = Beam(tmp_path / 'weir', lambda: budget_server)
  run = beam.run_named('fan_out_gbk', 'LOOPBACK')
  assert run.returncode == 0, run.describe(budget_server)
  _, got = run.output()
  assert got == want, (
      'output differs from DirectRunner\n  missing: %s\n  unexpected: %s' %
      (list(want - got)[:5], list(got - want)[:5]))

  log = budget_server.log_path.read_text(errors='replace')
  spilled = [int(n) for s in re.findall(r'spilled=\[([0-9, ]*)\]', log)
             for n in s.split(',') if n.strip()]
  assert any(n > 1 << 20 for n in spilled), 'no bundle output was spilled:\n' + log[-3000:]
  assert 'GroupByKey spilled its groups to disk' in log, log[-3000:]
  # Spill files are unlinked as they are made, and the job's folder goes.
  leftovers = [os.path.join(d, f) for d, _, fs in os.walk(budget_server.spill_dir) for f in fs]
  assert leftovers == [], leftovers
