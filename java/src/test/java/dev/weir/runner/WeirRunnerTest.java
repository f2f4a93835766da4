package dev.weir.runner;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import java.io.File;
import java.net.ServerSocket;
import java.util.logging.Handler;
import java.util.logging.LogManager;
import org.apache.beam.sdk.Pipeline;
import org.apache.beam.sdk.PipelineResult;
import org.apache.beam.sdk.options.PipelineOptionsFactory;
import org.apache.beam.sdk.transforms.Create;
import org.apache.beam.sdk.transforms.DoFn;
import org.apache.beam.sdk.transforms.ParDo;
import org.apache.beam.sdk.transforms.Sum;
import org.junit.Assume;
import org.junit.Test;

/**
 * {@link WeirRunner}'s errors before a job runs and, when a weir binary is at hand ({@code
 * $WEIR_BIN}), LOOPBACK jobs on a {@code weir serve} the runner starts.
 */
public class WeirRunnerTest {

  private static int freePort() throws Exception {
    try (ServerSocket s = new ServerSocket(0)) {
      return s.getLocalPort();
    }
  }

  private static Pipeline sum(WeirPipelineOptions options) {
    Pipeline p = Pipeline.create(options);
    p.apply(Create.of(1, 2, 3)).apply(Sum.integersGlobally());
    return p;
  }

  @Test
  public void endpointWithNothingListeningFailsFast() throws Exception {
    String endpoint = "localhost:" + freePort();
    WeirPipelineOptions options =
        PipelineOptionsFactory.fromArgs(
                "--runner=WeirRunner",
                "--jobEndpoint=" + endpoint,
                "--defaultEnvironmentType=EXTERNAL",
                "--defaultEnvironmentConfig=localhost:1",
                "--filesToStage=")
            .as(WeirPipelineOptions.class);
    long start = System.nanoTime();
    try {
      sum(options).run();
      fail("ran without a job service");
    } catch (RuntimeException e) {
      assertTrue(
          e.getMessage(),
          e.getMessage().startsWith("cannot connect to a Weir job service at " + endpoint));
    }
    long seconds = (System.nanoTime() - start) / 1_000_000_000L;
    assertTrue("took " + seconds + " s", seconds < WeirRunner.CONNECT_TIMEOUT_SECONDS + 5);
  }

  @Test
  public void processWithoutBinaryNamesBootEvenWithEndpoint() {
    Assume.assumeTrue(System.getenv("WEIR_BIN") == null || System.getenv("WEIR_BIN").isEmpty());
    for (String dir : System.getenv().getOrDefault("PATH", "").split(File.pathSeparator)) {
      Assume.assumeFalse(new File(dir, "weir").canExecute());
    }
    WeirPipelineOptions options =
        PipelineOptionsFactory.fromArgs(
                "--runner=WeirRunner",
                "--jobEndpoint=localhost:1",
                "--defaultEnvironmentType=PROCESS")
            .as(WeirPipelineOptions.class);
    try {
      sum(options).run();
      fail("ran without a weir binary");
    } catch (IllegalStateException e) {
      assertTrue(e.getMessage(), e.getMessage().contains("PROCESS"));
      assertTrue(e.getMessage(), e.getMessage().contains("boot --java"));
      assertTrue(e.getMessage(), e.getMessage().contains("even with --jobEndpoint"));
    }
  }

  private static boolean beamHandlerInstalled() {
    for (Handler h : LogManager.getLogManager().getLogger("").getHandlers()) {
      if (h.getClass().getName().startsWith("org.apache.beam.fn.harness.logging.")) {
        return true;
      }
    }
    return false;
  }

  /** Throws on 7. */
  static class ThrowOnSeven extends DoFn<Integer, Integer> {
    @ProcessElement
    public void process(@Element Integer x, OutputReceiver<Integer> out) {
      if (x == 7) {
        throw new IllegalStateException("bad record 7");
      }
      out.output(x);
    }
  }

  /** Needs $WEIR_BIN: two LOOPBACK runs with one options object, then a failing one. */
  @Test
  public void loopbackRunsTwiceRestoresLoggingAndThrowsOnFailure() {
    String bin = System.getenv("WEIR_BIN");
    Assume.assumeTrue("needs $WEIR_BIN", bin != null && new File(bin).canExecute());
    WeirPipelineOptions options =
        PipelineOptionsFactory.fromArgs("--runner=WeirRunner", "--weirBinary=" + bin)
            .as(WeirPipelineOptions.class);
    for (int i = 0; i < 2; i++) {
      assertEquals(PipelineResult.State.DONE, sum(options).run().waitUntilFinish());
      assertFalse("logging still goes to Weir after run " + i, beamHandlerInstalled());
    }
    Pipeline p = Pipeline.create(options);
    p.apply(Create.of(1, 7)).apply("MaybeThrow", ParDo.of(new ThrowOnSeven()));
    PipelineResult result = p.run();
    try {
      result.waitUntilFinish();
      fail("waitUntilFinish returned for a failed job");
    } catch (Pipeline.PipelineExecutionException e) {
      assertTrue(e.getMessage(), e.getMessage().contains("IllegalStateException: bad record 7"));
    }
    assertEquals(PipelineResult.State.FAILED, result.getState());
    assertFalse("logging still goes to Weir after the failed run", beamHandlerInstalled());
  }
}
