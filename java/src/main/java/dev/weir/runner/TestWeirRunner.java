package dev.weir.runner;

import static org.hamcrest.MatcherAssert.assertThat;

import java.util.List;
import org.apache.beam.sdk.Pipeline;
import org.apache.beam.sdk.PipelineResult;
import org.apache.beam.sdk.PipelineRunner;
import org.apache.beam.sdk.metrics.MetricsEnvironment;
import org.apache.beam.sdk.options.PipelineOptions;
import org.apache.beam.sdk.testing.TestPipelineOptions;
import org.joda.time.Duration;

/**
 * {@link WeirRunner} for tests (Beam's ValidatesRunner suites): runs the pipeline, waits until it
 * finishes (at most {@code --testTimeoutSeconds}, else cancels it), and throws unless it ended
 * DONE. The job's error messages are in the exception: an {@link AssertionError} when they show a
 * failed assertion (as a {@code PAssert} failure surfaces on Beam's DirectRunner), else a {@link
 * Pipeline.PipelineExecutionException}. It also checks {@link TestPipelineOptions}'s on-create and
 * on-success matchers, and tells Beam that metrics are supported, so {@code TestPipeline} checks
 * that every {@code PAssert} ran.
 *
 * <p>Use it with {@code -DbeamTestPipelineOptions='["--runner=TestWeirRunner",
 * "--jobEndpoint=localhost:8099"]'}.
 */
public class TestWeirRunner extends PipelineRunner<PipelineResult> {
  private final PipelineOptions options;

  private TestWeirRunner(PipelineOptions options) {
    this.options = options;
  }

  /** Creates the runner; Beam calls this for {@code --runner=TestWeirRunner}. */
  public static TestWeirRunner fromOptions(PipelineOptions options) {
    return new TestWeirRunner(options);
  }

  @Override
  public PipelineResult run(Pipeline pipeline) {
    TestPipelineOptions test = options.as(TestPipelineOptions.class);
    MetricsEnvironment.setMetricsSupported(true);
    WeirPipelineResult result = (WeirPipelineResult) WeirRunner.fromOptions(options).run(pipeline);
    assertThat(result, test.getOnCreateMatcher());
    Long timeout = test.getTestTimeoutSeconds();
    // Not waitUntilFinish, which throws for a FAILED job: the exception is chosen below.
    PipelineResult.State state =
        result.awaitTerminal(
            timeout == null || timeout <= 0 ? Duration.ZERO : Duration.standardSeconds(timeout));
    if (state == null) {
      result.cancel();
      throw new AssertionError(
          "Job " + result.getJobId() + " did not finish within " + timeout + " s" + describe(result));
    }
    if (state != PipelineResult.State.DONE) {
      String message =
          "Job " + result.getJobId() + " ended " + state + " (expected DONE)" + describe(result);
      if (message.contains("AssertionError")) {
        throw new AssertionError(message);
      }
      throw new Pipeline.PipelineExecutionException(new RuntimeException(message));
    }
    assertThat(result, test.getOnSuccessMatcher());
    return result;
  }

  private static String describe(WeirPipelineResult result) {
    List<String> problems = result.getProblems();
    if (problems.isEmpty()) {
      return "";
    }
    return ":\n" + String.join("\n", problems);
  }

  @Override
  public String toString() {
    return "TestWeirRunner";
  }
}
