"""Beam tests that Beam's PrismRunnerTest skips only because Prism lacks the
feature, run against Weir through the same harness.

`WeirRunnerTest` inherits PrismRunnerTest (so it launches the `weir` binary
given as --prism_bin, exactly as the suite does) and re-enables the inherited
FnApiRunnerTest bodies of tests Prism skips. Run with conformance/run.sh,
which selects these by the `WeirRunnerTest::` prefix in the ledger.
"""

import os
import socket
import subprocess
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import DebugOptions
from apache_beam.runners.portability import flink_runner_test
from apache_beam.runners.portability import prism_runner_test
from apache_beam.runners.portability.fn_api_runner import fn_runner_test


class WeirRunnerTest(prism_runner_test.PrismRunnerTest):
  # Beam's harness picks a job port and an expansion port and hands both to
  # `_subprocess_command` (the Flink job server serves expansion on the
  # second). Weir's job server stays `weir --job_port N`; beside it this
  # starts `weir expansion-service --port M` (Beam's Java expansion service,
  # whose environments Weir runs without Docker) and waits until it answers.
  _expansion_service = None

  @classmethod
  def _subprocess_command(cls, job_port, expansion_port):
    command = super()._subprocess_command(job_port, expansion_port)
    cls._start_expansion_service(expansion_port)
    return command

  @classmethod
  def _start_expansion_service(cls, port):
    cls._stop_expansion_service()
    log_path = os.path.join(cls.conf_dir or '/tmp', 'expansion-service.log')
    log = open(log_path, 'wb')
    cls._expansion_service = subprocess.Popen(
        [cls.prism_bin, 'expansion-service', '--port', str(port)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 180
    while True:
      if cls._expansion_service.poll() is not None:
        with open(log_path, errors='replace') as f:
          raise RuntimeError(
              'weir expansion-service exited (%s): %s' %
              (cls._expansion_service.returncode, f.read()[-3000:]))
      try:
        socket.create_connection(('localhost', port), timeout=1).close()
        return
      except OSError:
        if time.time() > deadline:
          raise RuntimeError('weir expansion-service did not listen on %d' % port)
        time.sleep(0.2)

  @classmethod
  def _stop_expansion_service(cls):
    if cls._expansion_service is not None:
      cls._expansion_service.terminate()
      try:
        cls._expansion_service.wait(30)
      except subprocess.TimeoutExpired:
        cls._expansion_service.kill()
      cls._expansion_service = None

  @classmethod
  def tearDownClass(cls):
    cls._stop_expansion_service()
    super().tearDownClass()

  # PrismRunnerTest skips these: "Requires an expansion service to execute."
  # FlinkRunnerTest holds their bodies (its PROCESS skips concern Flink).
  def test_external_transform(self):
    flink_runner_test.FlinkRunnerTest.test_external_transform(self)

  def test_expand_kafka_read(self):
    flink_runner_test.FlinkRunnerTest.test_expand_kafka_read(self)

  def test_expand_kafka_write(self):
    flink_runner_test.FlinkRunnerTest.test_expand_kafka_write(self)

  def test_sql(self):
    flink_runner_test.FlinkRunnerTest.test_sql(self)

  # FnApiRunnerTest's drain tests build `create_pipeline(is_drain=True)`,
  # which the FnApiRunner runs as if drained from the start; Weir does the
  # same under its test-only experiment `weir_test_drain_at_start`.
  def create_pipeline(self, is_drain=False):
    options = self.create_options()
    if is_drain:
      options.view_as(DebugOptions).add_experiment('weir_test_drain_at_start')
    return beam.Pipeline(self.get_runner(), options)

  # PrismRunnerTest skips it: "Requires Prism to support Custom Window Coders".
  def test_custom_window_type(self):
    fn_runner_test.FnApiRunnerTest.test_custom_window_type(self)

  # PrismRunnerTest skips it: "Requires Prism to support ... Merging Custom
  # Windows". Weir's GroupByKey has the SDK merge them
  # (beam:transform:merge_windows:v1).
  def test_custom_merging_window(self):
    fn_runner_test.FnApiRunnerTest.test_custom_merging_window(self)


  # FnApiRunnerTest marks these @unittest.skip for the Python FnApiRunner's own
  # flakiness (beam#23944, beam#21228, BEAM-9119); the pipelines are valid
  # Beam and Weir runs them, so run the undecorated bodies.
  def test_batch_pardo_trigger_flush(self):
    fn_runner_test.FnApiRunnerTest.test_batch_pardo_trigger_flush.__wrapped__(
        self)

  def test_pardo_large_input(self):
    fn_runner_test.FnApiRunnerTest.test_pardo_large_input.__wrapped__(self)

  def test_pardo_side_input_sparse_dependencies(self):
    fn_runner_test.FnApiRunnerTest.test_pardo_side_input_sparse_dependencies.__wrapped__(  # pylint: disable=line-too-long
        self)

  def test_large_elements(self):
    fn_runner_test.FnApiRunnerTest.test_large_elements.__wrapped__(self)

  # FnApiRunnerTest skips it: "TestStream not yet supported" (its runner
  # lacks TestStream); Weir replays TestStream events.
  def test_teststream_pardo_timers(self):
    fn_runner_test.FnApiRunnerTest.test_teststream_pardo_timers.__wrapped__(
        self)

  # PortableRunnerTest skips these: "Portable runners don't support drain
  # yet." Weir truncates restrictions when drained.
  def test_sdf_default_truncate_when_bounded(self):
    fn_runner_test.FnApiRunnerTest.test_sdf_default_truncate_when_bounded(self)

  def test_sdf_default_truncate_when_unbounded(self):
    fn_runner_test.FnApiRunnerTest.test_sdf_default_truncate_when_unbounded(
        self)

  def test_sdf_with_truncate(self):
    fn_runner_test.FnApiRunnerTest.test_sdf_with_truncate(self)

  def test_draining_sdf_with_sdf_initiated_checkpointing(self):
    fn_runner_test.FnApiRunnerTest.test_draining_sdf_with_sdf_initiated_checkpointing(  # pylint: disable=line-too-long
        self)
