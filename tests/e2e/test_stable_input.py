"""`beam:requirement:pardo:stable_input:v1`: the retried bundle of a
stable-input ParDo sees exactly the elements of the failed attempt, although
the step before it tags every element with a fresh random id each time it
runs (pipelines_stable_input.py)."""

import collections
import subprocess
import sys
from pathlib import Path

from conftest import read_output

SCRIPT = Path(__file__).resolve().with_name('pipelines_stable_input.py')


def test_retried_bundle_of_a_stable_input_pardo_sees_identical_input(weir_server, tmp_path):
  prefix = tmp_path / 'out'
  run = subprocess.run(
      [sys.executable, str(SCRIPT), str(prefix), '--runner=PortableRunner',
       '--job_endpoint=' + weir_server.endpoint, '--environment_type=LOOPBACK'],
      capture_output=True, text=True, timeout=300, cwd=SCRIPT.parent)
  assert run.returncode == 0, '%s\n%s\n%s' % (
      run.stdout[-2000:], run.stderr[-4000:], weir_server.log_tail())
  assert (tmp_path / 'failed-once').exists()
  seen = (tmp_path / 'seen.txt').read_text().split()
  tags = collections.defaultdict(set)
  for line in seen:
    number, tag = line.split(':')
    tags[int(number)].add(tag)
  assert seen.count(next(l for l in seen if l.startswith('3:'))) >= 2, seen
  # Every element, in every attempt, carried the same id: the input was stable.
  assert {n: len(t) for n, t in tags.items()} == {n: 1 for n in range(20)}, tags
  _, lines = read_output(prefix)
  assert lines == collections.Counter('%d:%s' % (n, next(iter(tags[n]))) for n in range(20))
