"""DOCKER environments without a Docker daemon: Weir replaces Beam's own
Python SDK image by a native `weir boot --python` harness (and says so in the
job's messages), and refuses any other image at Prepare, naming it. These
tests need a machine where `docker info` fails; they skip elsewhere."""

import subprocess
import sys
import time

import pytest

from conftest import PIPELINES_PY, read_output, weir_jobs


def _docker_answers():
  try:
    return subprocess.run(['docker', 'info'], capture_output=True, timeout=15).returncode == 0
  except (OSError, subprocess.TimeoutExpired):
    return False


pytestmark = pytest.mark.skipif(_docker_answers(), reason='a Docker daemon answers here')


def _docker_options(server, image):
  return ['--runner=PortableRunner', '--job_endpoint=' + server.endpoint,
          '--environment_type=DOCKER', '--environment_config=' + image]


def test_beam_python_image_runs_on_a_native_harness_with_the_direct_runners_output(
    beam, weir_server):
  direct = beam.run_named('gbk', 'DIRECT')
  assert direct.returncode == 0, direct.describe()
  out = beam._new_dir('gbk-docker-out') / 'out'
  run = beam.run(
      [PIPELINES_PY, 'gbk', '--output', out] +
      _docker_options(weir_server, 'apache/beam_python3.11_sdk:2.77.0'),
      out, 'gbk-docker')
  assert run.returncode == 0, run.describe(weir_server)
  assert run.output()[1] == direct.output()[1]
  jobs = [line.split('\t')[0] for line in weir_jobs(weir_server, 'list').splitlines()[1:]]
  note = 'image apache/beam_python3.11_sdk:2.77.0 is replaced by a native harness'
  assert any(note in weir_jobs(weir_server, 'logs', job) for job in jobs), jobs


def test_an_image_without_a_daemon_fails_at_prepare_naming_it(beam, weir_server):
  started = time.monotonic()
  out = beam._new_dir('nope-out') / 'out'
  run = beam.run(
      [PIPELINES_PY, 'gbk', '--output', out] +
      _docker_options(weir_server, 'example.com/nope:1'),
      out, 'nope')
  assert run.returncode != 0
  assert time.monotonic() - started < 60
  assert 'image example.com/nope:1 cannot be run' in run.stderr, run.describe(weir_server)
