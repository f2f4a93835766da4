"""Time-sorted input (Java's `@RequiresTimeSortedInput`,
`beam:requirement:pardo:time_sorted_input:v1`): a stateful DoFn sees each
key's elements in timestamp order although they arrive in reverse, in
batch and in streaming (where the elements given after the watermark moved
are late but within the allowed lateness, and are sorted in too).
pipelines_time_sorted.py marks a Python DoFn's proto as Beam's Java SDK
does."""

import collections
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import read_output

SCRIPT = Path(__file__).resolve().with_name('pipelines_time_sorted.py')
N = 300

# Every value after the one before it, per key.
EXPECTED = collections.Counter(
    '%s %d after %d' % (k, v, v - 1) for k in ('a', 'b') for v in range(1, N + 1))


@pytest.mark.parametrize('mode', ['batch', 'stream'])
def test_each_key_sees_its_elements_in_timestamp_order(weir_server, tmp_path, mode):
  prefix = tmp_path / 'out'
  args = [sys.executable, str(SCRIPT), str(prefix),
          '--runner=PortableRunner', '--job_endpoint=' + weir_server.endpoint,
          '--environment_type=LOOPBACK']
  if mode == 'stream':
    args.append('--stream')
  run = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=SCRIPT.parent)
  assert run.returncode == 0, '%s\n%s\n%s' % (
      run.stdout[-2000:], run.stderr[-4000:], weir_server.log_tail())
  _, lines = read_output(prefix)
  assert lines == EXPECTED, (
      'missing: %s\nunexpected: %s' % (sorted(EXPECTED - lines)[:5], sorted(lines - EXPECTED)[:5]))
