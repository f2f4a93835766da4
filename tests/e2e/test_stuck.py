"""A job that stops making progress is reported as stuck, with the stage it
waits at and that stage's input watermark (issue 3: "a stuck job is reported
as stuck with the stage and its watermark, not left hanging")."""

import re


def test_stuck_job_names_its_stage_and_watermark(beam, weir_server):
  # `slow` runs a DoFn that sleeps 60 s; with the test-only experiment the
  # watchdog reports after 2 s without progress; the job is then cancelled.
  run = beam.run_named(
      'slow', 'LOOPBACK',
      extra=['--cancel_after', '8',
             '--experiments=weir_test_stuck_after_seconds=2'])
  out = run.stdout + run.stderr
  assert 'CANCELLED' in out, run.describe(weir_server)
  m = re.search(
      r'the job has made no progress for (\d+) s; it waits at stage (\S+) '
      r'\((\S*Nap\S*)\): input watermark ([^,;]+), (\d+) bundle\(s\) at SDK harnesses',
      out)
  assert m, run.describe(weir_server)
  assert int(m.group(1)) >= 2
  # The napping stage's input is done; its bundle is what the job waits for.
  assert m.group(4) == '+inf (input done)', m.group(0)
  assert int(m.group(5)) >= 1
  # Stages downstream wait at Beam's minimum watermark.
  assert "input watermark -inf (Beam's MIN)" in out, out
  assert weir_server.alive(), weir_server.log_tail()
