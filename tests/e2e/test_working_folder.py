"""Relative paths in a pipeline: a Python SDK harness of a PROCESS
environment (`weir boot --python`) works in Weir's working folder, as
Prism's harnesses work in Prism's, so `--input lear.txt --output out/counts`
from a client in the folder `weir serve` was started in read and write
there: the same counts as DirectRunner's, not an empty read (the harness's
own folder holds no lear.txt) or a write into the worker's folder.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import WEIR_BIN, _wait_for_job_api, king_lear_path, read_output, start_weir_serve


@pytest.fixture(params=[[], ['--python_fork_server=false']], ids=['forked', 'exec'])
def project(tmp_path, request):
  """A user's folder with King Lear in it, and `weir serve` started there
  (with its Python fork server, or without: `weir boot` execs Python)."""
  folder = tmp_path / 'project'
  folder.mkdir()
  shutil.copy(king_lear_path(), folder / 'lear.txt')
  server = start_weir_serve(
      tmp_path / 'weir.log', ['--bind', '127.0.0.1', '--ui_port', '0',
                              '--staging_dir', tmp_path / 'staging'] + request.param,
      env=dict(os.environ, NO_COLOR='1'), cwd=folder)
  try:
    _wait_for_job_api(server)
    yield folder, server
  finally:
    if server.alive():
      server.proc.terminate()
      server.proc.wait(timeout=30)


def wordcount(folder, output, runner_options):
  run = subprocess.run(
      [sys.executable, '-m', 'apache_beam.examples.wordcount',
       '--input', 'lear.txt', '--output', output] + runner_options,
      cwd=folder, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-4000:]
  files, lines = read_output(str(folder / output))
  return files, lines


def test_relative_input_and_output_resolve_in_weir_s_folder(project):
  folder, server = project
  _, expected = wordcount(
      folder, 'direct/counts', ['--runner=DirectRunner', '--direct_num_workers=1'])
  assert len(expected) > 4000, 'King Lear has thousands of distinct words'

  boot = '%s boot --python %s' % (WEIR_BIN, sys.executable)
  files, counts = wordcount(
      folder, 'weir/counts',
      ['--runner=PortableRunner', '--job_endpoint=%s' % server.endpoint,
       '--environment_type=PROCESS',
       '--environment_config=' + json.dumps({'command': boot})])
  assert files and all(f.startswith(str(folder / 'weir')) for f in files), files
  assert counts == expected, server.log_tail()
