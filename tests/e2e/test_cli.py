"""`weir jobs list|describe|cancel` against the running server."""

import datetime

from conftest import weir_jobs


def test_jobs_list_describe_cancel(beam, weir_server):
  # Named, so the row is this job's whichever tests ran before on the server.
  run = beam.run_named('good', 'LOOPBACK', extra=['--job_name=cli-describe'])
  assert run.returncode == 0, run.describe(weir_server)

  lines = weir_jobs(weir_server, 'list').splitlines()
  assert lines[0] == 'JOB_ID\tSTATE\tNAME\tSTART\tEND\tLABELS', lines
  rows = [line.split('\t') for line in lines[1:]]
  assert all(len(r) == 6 for r in rows), rows
  done = [r for r in rows if r[1] == 'DONE' and r[2] == 'cli-describe']
  assert done, rows
  # Oldest start first, and the job just run, the server's newest, last.
  starts = [datetime.datetime.fromisoformat(r[3].replace('Z', '+00:00')) for r in rows if r[3] != '-']
  assert starts == sorted(starts), rows
  assert rows[-1][0] == done[-1][0], rows
  job_id = done[-1][0]

  described = weir_jobs(weir_server, 'describe', job_id)
  assert 'id:    %s' % job_id in described, described
  assert 'state: DONE' in described, described
  assert 'start: %s' % done[-1][3] in described and 'end:   %s' % done[-1][4] in described, described
  # The state history, in order, with times.
  history = [l.split()[-1] for l in described.split('history:')[1].split('options:')[0].splitlines() if l.strip()]
  assert history == ['STOPPED', 'STARTING', 'RUNNING', 'DONE'], described
  assert 'environment_type = LOOPBACK' in described, described

  # Cancelling a finished job leaves it DONE.
  assert weir_jobs(weir_server, 'cancel', job_id).split() == [job_id, 'DONE']
