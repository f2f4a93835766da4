"""Beam's PrismRunnerTest on a Weir cluster: the same tests, each job run on
three `weir worker` processes (`--num_workers=3`) of a coordinator
(`weir serve --cluster_port --local_workers 3`) that Beam's harness starts
in place of `weir --job_port N`. Selected by the `WeirClusterRunnerTest::`
prefix in conformance/ledger.txt; run with conformance/run.sh.
"""

import socket

from apache_beam.options.pipeline_options import WorkerOptions
from apache_beam.runners.portability import prism_runner_test

WORKERS = 3


def _free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


class WeirClusterRunnerTest(prism_runner_test.PrismRunnerTest):
  @classmethod
  def _subprocess_command(cls, job_port, expansion_port):
    command = super()._subprocess_command(job_port, expansion_port)
    # [weir, --job_port, N] -> weir serve --job_port N, as a coordinator.
    return [command[0], 'serve'] + command[1:] + [
        '--cluster_port', str(_free_port()), '--local_workers', str(WORKERS),
        '--serve_http=false']

  def create_options(self):
    options = super().create_options()
    options.view_as(WorkerOptions).num_workers = WORKERS
    return options
