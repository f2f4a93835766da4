"""Beam tests that Beam's PrismRunnerTest skips only because Prism lacks the
feature, run against Weir through the same harness.

`WeirRunnerTest` inherits PrismRunnerTest (so it launches the `weir` binary
given as --prism_bin, exactly as the suite does) and re-enables the inherited
FnApiRunnerTest bodies of tests Prism skips. Run with conformance/run.sh,
which selects these by the `WeirRunnerTest::` prefix in the ledger.
"""

from apache_beam.runners.portability import prism_runner_test
from apache_beam.runners.portability.fn_api_runner import fn_runner_test


class WeirRunnerTest(prism_runner_test.PrismRunnerTest):
  # PrismRunnerTest skips it: "Requires Prism to support Custom Window Coders".
  def test_custom_window_type(self):
    fn_runner_test.FnApiRunnerTest.test_custom_window_type(self)

