"""On-window-expiration callbacks (Java's `@OnWindowExpiration`, carried in
`ParDoPayload.on_window_expiration_timer_family_spec`): Weir fires the named
timer family once per key and window of a stateful DoFn when the window
expires, while the window's state is still there, in batch and streaming.
pipelines_window_expiration.py builds such a DoFn from Python (which has no
annotation for it) by marking the proto as Beam's Java SDK does."""

import collections
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import read_output

SCRIPT = Path(__file__).resolve().with_name('pipelines_window_expiration.py')

# EVENTS in FixedWindows(10): every (key, window) once, with all its values.
EXPECTED = collections.Counter([
    'expired k [1, 2] [0.0, 10.0)',
    'expired j [7] [0.0, 10.0)',
    'expired k [5] [10.0, 20.0)',
    'expired j [8] [20.0, 30.0)',
])


@pytest.mark.parametrize('mode', ['batch', 'stream'])
def test_window_expiration_callback_fires_once_per_key_and_window_with_its_state(
    weir_server, tmp_path, mode):
  prefix = tmp_path / 'out'
  args = [sys.executable, str(SCRIPT), str(prefix),
          '--runner=PortableRunner', '--job_endpoint=' + weir_server.endpoint,
          '--environment_type=LOOPBACK']
  if mode == 'stream':
    args.append('--stream')
  run = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=SCRIPT.parent)
  assert run.returncode == 0, '%s\n%s\n%s' % (run.stdout[-2000:], run.stderr[-4000:], weir_server.log_tail())
  _, lines = read_output(prefix)
  assert lines == EXPECTED, lines
