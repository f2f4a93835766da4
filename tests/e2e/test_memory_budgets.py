"""User state and side inputs under their memory budgets (`weir serve
--user_state_memory_budget_mb`, `--side_input_memory_budget_mb`).

Weir keeps user state and side inputs in memory, so a job whose state or
side input outgrows its budget must fail cleanly, naming the state and the flag, without retrying (in
streaming too, where a failing bundle is otherwise retried forever), while
the server keeps serving other jobs; under the default budget the same pipeline gives the
lines worked out from its input.
"""

import collections
from pathlib import Path

import pytest

from conftest import start_weir_serve, serving

SCRIPT = Path(__file__).resolve().with_name('pipelines_state.py')

# state_big_bag: keys k0..k3, 20 values of 100,000 chars each.
EXPECTED_BIG_BAG = collections.Counter(
    'big k%d 20 values 2000000 chars' % k for k in range(4))


@pytest.fixture
def small_budget_server(tmp_path):
  server = start_weir_serve(
      tmp_path / 'weir-small-budgets.log',
      ['--bind', '127.0.0.1', '--staging_dir', tmp_path / 'staging',
       '--user_state_memory_budget_mb', '1', '--side_input_memory_budget_mb', '1'])
  with serving(server):
    yield server


def test_state_within_the_default_budget_gives_its_lines(beam, weir_server):
  run = beam.run_named('state_big_bag', 'LOOPBACK', script=SCRIPT)
  assert run.returncode == 0, run.describe(weir_server)
  _, lines = run.output()
  assert lines == EXPECTED_BIG_BAG, lines


@pytest.mark.parametrize('extra', [(), ('--streaming',)], ids=['batch', 'streaming'])
def test_state_past_the_budget_fails_the_job_and_the_server_serves_on(
    tmp_path, small_budget_server, extra):
  from conftest import Beam
  beam = Beam(tmp_path / 'weir', lambda: small_budget_server)
  run = beam.run_named('state_big_bag', 'LOOPBACK', extra=extra, script=SCRIPT)
  assert run.returncode != 0, 'the job must fail\n' + run.describe(small_budget_server)
  text = (run.client_error() or '') + run.stderr
  for part in ('user state "big" of transform "ParDo(BigBagDoFn)"', 'budget of 1048576 bytes',
               '--user_state_memory_budget_mb'):
    assert part in text, '%r not in the error\n%s' % (
        part, run.describe(small_budget_server))
  # A retry would be refused again: the first refusal fails the job.
  assert 'bundle failed' not in text, text
  # The same server runs the next job, with state under its budget.
  ok = beam.run_named('state_bag', 'LOOPBACK', script=SCRIPT)
  assert ok.returncode == 0, ok.describe(small_budget_server)
  _, lines = ok.output()
  assert 'final a [1, 1, 4, 5]' in lines, lines


# big_side_input: 4 strings of 1 MiB, read by x and y.
EXPECTED_BIG_SIDE = collections.Counter(
    '%s: 4 strings, 4194304 bytes' % m for m in 'xy')


def test_side_input_within_the_default_budget_gives_its_lines(beam, weir_server):
  run = beam.run_named('big_side_input', 'LOOPBACK')
  assert run.returncode == 0, run.describe(weir_server)
  _, lines = run.output()
  assert lines == EXPECTED_BIG_SIDE, lines


def test_side_input_past_the_budget_fails_the_job_and_the_server_serves_on(
    tmp_path, small_budget_server):
  from conftest import Beam
  beam = Beam(tmp_path / 'weir', lambda: small_budget_server)
  run = beam.run_named('big_side_input', 'LOOPBACK')
  assert run.returncode != 0, 'the job must fail\n' + run.describe(small_budget_server)
  text = (run.client_error() or '') + run.stderr
  for part in ('its side inputs ("python_side_input0" of transform "Read")',
               'past their budget of 1048576 bytes',
               '--side_input_memory_budget_mb'):
    assert part in text, '%r not in the error\n%s' % (
        part, run.describe(small_budget_server))
  ok = beam.run_named('state_bag', 'LOOPBACK', script=SCRIPT)
  assert ok.returncode == 0, ok.describe(small_budget_server)


def run_expiring(tmp_path, server, name):
  """Runs pipelines_side_inputs.py's `name` in streaming on `server`; returns
  the run, its output lines, and the side-data chars of window i."""
  import pipelines_side_inputs as psi
  from conftest import Beam
  beam = Beam(tmp_path / 'weir', lambda: server)
  run = beam.run_named(name, 'LOOPBACK', extra=['--streaming', '--allow_unsafe_triggers'],
                       script=SCRIPT.with_name('pipelines_side_inputs.py'))
  assert run.returncode == 0, run.describe(server)
  _, lines = run.output()
  return run, lines, lambda i, strings: strings * (psi.EXPIRING_CHARS + len('w%d ' % i))


def test_expired_side_windows_are_let_go_in_a_long_streaming_job(tmp_path, small_budget_server):
  """Thirty windows of side data (9 MB in all, 300 KB a window) under a
  1 MiB budget: each window's side data goes once its window expired, so
  the job finishes, and every main element saw exactly its own window's.
  A main and a side element of the first window arriving after it expired
  are dropped, each with a notice."""
  import pipelines_side_inputs as psi
  run, lines, chars = run_expiring(tmp_path, small_budget_server, 'side_windows_expire')
  n = psi.EXPIRING_STRINGS
  expected = collections.Counter(
      "w%d: %d strings of w['%d'], %d chars" % (i, n, i, chars(i, n))
      for i in range(psi.EXPIRING_WINDOWS))
  assert lines == expected, lines
  text = run.stderr + run.describe(small_budget_server)
  for notice in ('dropped 1 late element window(s)', 'ignored 1 late side-input element(s)'):
    assert notice in text, '%r not in\n%s' % (notice, text)


def test_expired_side_windows_are_let_go_at_a_stateful_stage_with_timers(tmp_path, small_budget_server):
  """A stream of side data (6 MB in all, 200 KB a window) through a stateful
  DoFn that reads the side input and emits what it saw from a timer 20 s
  after each window's end, under the 1 MiB budget: timers of later windows
  are always pending, and each window's side data goes once its own timer
  fired."""
  import pipelines_side_inputs as psi
  _, lines, chars = run_expiring(tmp_path, small_budget_server, 'stateful_side_windows_expire')
  n = psi.STATEFUL_STRINGS
  expected = collections.Counter(
      'timer w%d: %d strings, %d chars' % (i, n, chars(i, n))
      for i in range(psi.EXPIRING_WINDOWS))
  assert lines == expected, lines
