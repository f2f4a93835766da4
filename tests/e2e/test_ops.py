"""Job management end to end: temp/staging locations, job logs, per-job CPU
and memory in GetJobMetrics, `weir jobs list|describe|logs` (pipelines in
pipelines_ops.py)."""

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import weir_jobs

PIPELINES_OPS = Path(__file__).resolve().with_name('pipelines_ops.py')


def list_rows(server):
  lines = weir_jobs(server, 'list').splitlines()
  assert lines[0].split('\t') == ['JOB_ID', 'STATE', 'NAME', 'START', 'END', 'LABELS'], lines
  return [dict(zip(lines[0].split('\t'), l.split('\t'))) for l in lines[1:]]


def job_named(server, name):
  rows = [r for r in list_rows(server) if r['NAME'] == name]
  assert len(rows) == 1, (name, rows)
  return rows[0]


def run_ops(beam, tmp_path, name, mode, *extra):
  out = tmp_path / ('%s-out' % name)
  result_file = tmp_path / ('%s-result.json' % name)
  run = beam.run(
      [PIPELINES_OPS, name, '--output', out, '--result_file', result_file] +
      list(extra) + beam.options(mode),
      out, '%s-%s' % (name, mode.lower()))
  result = None
  if result_file.exists():
    result = json.loads(result_file.read_text())
  return run, result


@pytest.mark.parametrize('form,mode', [('file_url', 'PROCESS'), ('path', 'LOOPBACK')])
def test_staging_location_holds_the_artifacts(beam, weir_server, tmp_path, form, mode):
  # A client's staging location must be under the server's staging root
  # (test_limits.py: elsewhere is refused).
  where = weir_server.staging_root / ('client-%s' % uuid.uuid4().hex[:8])
  location = 'file://%s' % where if form == 'file_url' else str(where)
  name = 'ops-staging-%s' % uuid.uuid4().hex[:8]
  run, result = run_ops(
      beam, tmp_path, 'staged', mode, '--staging_location=%s' % location,
      '--save_main_session', '--job_name=%s' % name)
  assert run.returncode == 0, run.describe(weir_server)
  assert result['state'] == 'DONE', result
  _, lines = run.output()
  assert sorted(lines) == ['a: hello from the main session', 'b: hello from the main session']

  job = job_named(weir_server, name)
  artifacts = sorted(p.name for p in (where / job['JOB_ID']).iterdir())
  # The pickled main session, staged by the SDK, stored where the option says
  # (and kept there after the job, as Dataflow keeps its staging files).
  assert any(a.endswith('pickled_main_session') for a in artifacts), artifacts
  assert all((where / job['JOB_ID'] / a).stat().st_size > 0 for a in artifacts), artifacts
  logs = weir_jobs(weir_server, 'logs', job['JOB_ID'])
  assert 'artifacts are staged under --staging_location=%s/%s' % (location, job['JOB_ID']) in logs, logs


def test_a_local_temp_location_outside_weir_s_folders_is_said_to_be_the_sdk_s(beam, weir_server, tmp_path):
  # The SDK writes its temp files there itself; the server keeps its own in
  # its folder, and the job's messages must not claim the option's folder
  # is unused.
  where = tmp_path / 'user-temp'
  where.mkdir()
  name = 'ops-temp-%s' % uuid.uuid4().hex[:8]
  run, result = run_ops(beam, tmp_path, 'staged', 'LOOPBACK', '--temp_location=%s' % where,
                        '--job_name=%s' % name)
  assert run.returncode == 0 and result['state'] == 'DONE', run.describe(weir_server)
  logs = weir_jobs(weir_server, 'logs', job_named(weir_server, name)['JOB_ID'])
  assert re.search(r"Weir's own temp files go to Weir's folder \S+, and the SDK writes its temp "
                   r'files to --temp_location=%s \(' % re.escape(str(where)), logs), logs


@pytest.mark.parametrize('option,location,why', [
    ('temp_location', 'gs://weir-test-no-bucket/tmp', 'no Google Cloud credentials found'),
    ('staging_location', 's3://weir-test-no-bucket/staging', 'no AWS credentials found'),
    ('temp_location', 'hdfs://nn/tmp', 'scheme hdfs:// is not supported'),
])
def test_unusable_locations_fail_prepare_naming_the_option(beam, weir_server, tmp_path, option, location, why):
  creds = [k for k in os.environ if k.startswith(('GOOGLE_', 'AWS_ACCESS_KEY_ID', 'AWS_WEB_IDENTITY'))]
  if creds and 'credentials' in why:
    pytest.skip('cloud credentials in the environment: %s' % creds)
  run, result = run_ops(beam, tmp_path, 'staged', 'LOOPBACK', '--%s=%s' % (option, location))
  assert run.returncode != 0 and result is None, run.describe(weir_server)
  # Options validation quotes the location ("hdfs://nn/tmp"); opening it does not.
  said = re.search(r'pipeline option --%s: "?%s"?: %s' % (option, re.escape(location), re.escape(why)), run.stderr)
  assert said, run.describe(weir_server)
  assert weir_server.alive()


def test_job_logs_keep_sdk_log_lines(beam, weir_server, tmp_path):
  marker = 'WEIR-MARKER-%s' % uuid.uuid4().hex
  name = 'ops-logs-%s' % uuid.uuid4().hex[:8]
  run, result = run_ops(
      beam, tmp_path, 'log_marker', 'PROCESS', '--marker=%s' % marker,
      '--job_name=%s' % name)
  assert run.returncode == 0, run.describe(weir_server)
  job = job_named(weir_server, name)
  logs = weir_jobs(weir_server, 'logs', job['JOB_ID']).splitlines()
  marked = sorted(re.search(r'element=(\d)', l).group(1) for l in logs if marker + ' element=' in l)
  assert marked == ['1', '2', '3', '4'], logs
  # What the DoFn printed to its harness's stdout is there too, per worker.
  printed = sorted(re.search(r'printed=(\d)', l).group(1) for l in logs if marker + ' printed=' in l)
  assert printed == ['1', '2', '3', '4'], logs
  assert all(re.search(r'\t\[%s-worker-\S+\] stdout: ' % job['JOB_ID'], l)
             for l in logs if marker + ' printed=' in l), logs
  # time, importance, text; the SDK's INFO lines are BASIC messages from a worker of the job.
  line = next(l for l in logs if marker + ' element=' in l)
  time_text, importance, text = line.split('\t', 2)
  assert re.fullmatch(r'\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z', time_text), line
  assert importance == 'BASIC', line
  assert text.startswith('[%s-worker-' % job['JOB_ID']), line
  states = [l.split('\t')[2] for l in logs if l.split('\t')[1] == 'STATE']
  assert states == ['STOPPED', 'STARTING', 'RUNNING', 'DONE'], logs


def test_job_logs_follow_a_running_job(beam, weir_server, tmp_path):
  marker = 'WEIR-FOLLOW-%s' % uuid.uuid4().hex
  name = 'ops-follow-%s' % uuid.uuid4().hex[:8]
  out = tmp_path / 'follow-out'
  client = subprocess.Popen(
      [sys.executable, str(PIPELINES_OPS), 'log_marker', '--output', str(out),
       '--marker=%s' % marker, '--sleep=1.5', '--job_name=%s' % name] +
      beam.options('PROCESS'),
      cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    deadline = time.time() + 120
    job = None
    while time.time() < deadline:
      rows = [r for r in list_rows(weir_server) if r['NAME'] == name]
      if rows and rows[0]['STATE'] == 'RUNNING':
        job = rows[0]
        break
      time.sleep(0.2)
    assert job, 'the job did not start running: %s' % rows
    assert job['END'] == '-', job
    # Follows until the job ends, then exits by itself.
    logs = weir_jobs(weir_server, 'logs', '--follow', job['JOB_ID'], timeout=180)
  finally:
    client_out, _ = client.communicate(timeout=180)
  assert client.returncode == 0, client_out
  lines = logs.splitlines()
  assert sum(marker + ' element=' in l for l in lines) == 4, logs
  assert lines[-1].split('\t')[1:] == ['STATE', 'DONE'], logs


def test_metrics_report_user_counters_and_resources(beam, weir_server, tmp_path):
  name = 'ops-metrics-%s' % uuid.uuid4().hex[:8]
  run, result = run_ops(
      beam, tmp_path, 'counters', 'PROCESS', '--sleep=0.3',
      '--job_name=%s' % name, '--labels=env=test', '--labels=team=ops')
  assert run.returncode == 0, run.describe(weir_server)
  # The user counter reads as the SDK counted it; Weir's own metrics are
  # listed under namespace "weir" and do not disturb name filters.
  assert result['counters'] == {'ops_elements': 0, 'ops_counted': 10}, result
  # Keyed by the step's name, as on Dataflow and DirectRunner, not by the
  # transform's id in the pipeline proto.
  assert result['steps'] == ['Work'], result
  assert result['by_step'] == {'Work/ops_counted': 10}, result
  assert 'weir/metric:sdk:cpu_msecs:v1' in result['weir_metrics'], result
  assert 'weir/metric:runner:memory_bytes:v1' in result['weir_metrics'], result

  job = job_named(weir_server, name)
  assert job['STATE'] == 'DONE' and job['LABELS'] == 'env=test,team=ops', job
  start, end = job['START'], job['END']
  assert re.fullmatch(r'\d{4}-.*Z', start) and re.fullmatch(r'\d{4}-.*Z', end) and start <= end, job

  described = weir_jobs(weir_server, 'describe', job['JOB_ID'])
  sdk = re.search(r'SDK: (\d+) process\(es\), ([\d.]+) CPU s, memory ([\d.]+) MiB \(peak ([\d.]+) MiB\)', described)
  assert sdk, described
  processes, cpu, _, peak = int(sdk.group(1)), float(sdk.group(2)), float(sdk.group(3)), float(sdk.group(4))
  # At least one SDK harness, which spent CPU (3 s of busy work) and held memory.
  assert processes >= 1 and cpu >= 1.0 and peak > 10, described
  runner = re.search(r'runner: ([\d.]+) CPU s since the job started, memory ([\d.]+) MiB', described)
  assert runner and float(runner.group(2)) > 1, described
  assert 'labels: env=test,team=ops' in described, described


def test_loopback_resources_say_sdk_is_not_measured(beam, weir_server, tmp_path):
  name = 'ops-loopback-%s' % uuid.uuid4().hex[:8]
  run, result = run_ops(beam, tmp_path, 'counters', 'LOOPBACK', '--job_name=%s' % name)
  assert run.returncode == 0, run.describe(weir_server)
  assert result['counters']['ops_counted'] == 10, result
  described = weir_jobs(weir_server, 'describe', job_named(weir_server, name)['JOB_ID'])
  assert 'SDK: not measured (no SDK process started by Weir' in described, described
  assert re.search(r'runner: [\d.]+ CPU s', described), described
