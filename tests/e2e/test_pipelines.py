"""Small pipelines run on Weir and on DirectRunner: outputs must be equal.

Each pipeline (tests/e2e/pipelines.py) writes its result with WriteToText;
the multiset of output lines under Weir must equal DirectRunner's.
"""

import pytest

from conftest import ENVIRONMENTS

PIPELINES = ('gbk', 'flatten', 'side_input', 'combine_per_key', 'windowed', 'custom_merging',
             'multimap_side_input', 'sdf_split', 'large_elements', 'paged_side_input')

_direct_cache = {}


def direct_output(beam, name):
  if name not in _direct_cache:
    run = beam.run_named(name, 'DIRECT')
    assert run.returncode == 0, run.describe()
    files, lines = run.output()
    assert files and lines, run.describe()
    _direct_cache[name] = lines
  return _direct_cache[name]


@pytest.mark.parametrize('env', ENVIRONMENTS)
@pytest.mark.parametrize('name', PIPELINES)
def test_pipeline_matches_direct_runner(beam, weir_server, name, env):
  expected = direct_output(beam, name)
  run = beam.run_named(name, env)
  assert run.returncode == 0, run.describe(weir_server)
  files, lines = run.output()
  assert files, 'no output files\n' + run.describe(weir_server)
  assert lines == expected, (
      'output differs from DirectRunner\n  missing: %s\n  unexpected: %s' %
      (dict(expected - lines), dict(lines - expected)))
