"""Beam's own wordcount example on King Lear: Weir must match DirectRunner."""

import pytest

from conftest import ENVIRONMENTS
from conftest import king_lear_path


@pytest.fixture(scope='module')
def direct_wordcount(module_beam):
  run = module_beam.run_wordcount(king_lear_path(), 'DIRECT')
  assert run.returncode == 0, run.describe()
  files, lines = run.output()
  assert files and sum(lines.values()) > 1000, run.describe()
  return lines


@pytest.mark.parametrize('env', ENVIRONMENTS)
def test_wordcount_matches_direct_runner(beam, weir_server, direct_wordcount, env):
  run = beam.run_wordcount(king_lear_path(), env)
  assert run.returncode == 0, run.describe(weir_server)
  files, lines = run.output()
  assert files, 'no output files at %s-*\n%s' % (
      run.output_prefix, run.describe(weir_server))
  assert sum(lines.values()) > 0
  missing = direct_wordcount - lines
  extra = lines - direct_wordcount
  assert lines == direct_wordcount, (
      '%d lines differ from DirectRunner; missing (first 10): %s; '
      'unexpected (first 10): %s' % (
          sum((missing + extra).values()), list(missing.items())[:10],
          list(extra.items())[:10]))
