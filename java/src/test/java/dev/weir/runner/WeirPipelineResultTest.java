package dev.weir.runner;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.apache.beam.model.jobmanagement.v1.JobApi;
import org.apache.beam.model.jobmanagement.v1.JobApi.JobMessage;
import org.apache.beam.model.jobmanagement.v1.JobApi.JobState;
import org.apache.beam.model.jobmanagement.v1.JobServiceGrpc;
import org.apache.beam.model.pipeline.v1.MetricsApi.MonitoringInfo;
import org.apache.beam.sdk.Pipeline;
import org.apache.beam.sdk.PipelineResult;
import org.apache.beam.sdk.metrics.MetricsFilter;
import org.apache.beam.vendor.grpc.v1p69p0.com.google.protobuf.ByteString;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.ManagedChannel;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.Server;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.inprocess.InProcessChannelBuilder;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.inprocess.InProcessServerBuilder;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.stub.StreamObserver;
import org.joda.time.Duration;
import org.junit.After;
import org.junit.Test;

/** {@link WeirPipelineResult} against an in-process Job API that ends the job as told. */
public class WeirPipelineResultTest {
  private final List<AutoCloseable> closers = new ArrayList<>();

  @After
  public void close() throws Exception {
    for (AutoCloseable c : closers) {
      c.close();
    }
  }

  /** A job service whose message stream sends {@code messages}, then {@code end}. */
  private WeirPipelineResult job(JobState.Enum end, String... messages) throws Exception {
    JobServiceGrpc.JobServiceImplBase service =
        new JobServiceGrpc.JobServiceImplBase() {
          @Override
          public void getMessageStream(
              JobApi.JobMessagesRequest request,
              StreamObserver<JobApi.JobMessagesResponse> out) {
            out.onNext(state(JobState.Enum.RUNNING));
            for (String m : messages) {
              JobMessage.MessageImportance importance =
                  m.startsWith("W:")
                      ? JobMessage.MessageImportance.JOB_MESSAGE_WARNING
                      : JobMessage.MessageImportance.JOB_MESSAGE_ERROR;
              out.onNext(
                  JobApi.JobMessagesResponse.newBuilder()
                      .setMessageResponse(
                          JobMessage.newBuilder()
                              .setImportance(importance)
                              .setMessageText(m.substring(2)))
                      .build());
            }
            out.onNext(state(end));
            out.onCompleted();
          }

          @Override
          public void getJobMetrics(
              JobApi.GetJobMetricsRequest request,
              StreamObserver<JobApi.GetJobMetricsResponse> out) {
            out.onNext(
                JobApi.GetJobMetricsResponse.newBuilder()
                    .setMetrics(
                        JobApi.MetricResults.newBuilder()
                            .addAttempted(
                                MonitoringInfo.newBuilder()
                                    .setUrn("beam:metric:user:sum_int64:v1")
                                    .setPayload(ByteString.copyFrom(new byte[] {3}))
                                    .putLabels("PTRANSFORM", "Step-ParMultiDo-Fn-")
                                    .putLabels("NAMESPACE", "ns")
                                    .putLabels("NAME", "n")))
                    .build());
            out.onCompleted();
          }
        };
    String name = InProcessServerBuilder.generateName();
    Server server =
        InProcessServerBuilder.forName(name).directExecutor().addService(service).build().start();
    closers.add(server::shutdownNow);
    ManagedChannel channel = InProcessChannelBuilder.forName(name).build();
    return new WeirPipelineResult(
        "job-1",
        channel,
        channel,
        new ArrayList<>(),
        Map.of("Step-ParMultiDo-Fn-", "Step/ParMultiDo(Fn)"));
  }

  private static JobApi.JobMessagesResponse state(JobState.Enum s) {
    return JobApi.JobMessagesResponse.newBuilder()
        .setStateResponse(JobApi.JobStateEvent.newBuilder().setState(s))
        .build();
  }

  @Test
  public void failedJobThrowsWithTheJobsError() throws Exception {
    WeirPipelineResult result =
        job(
            JobState.Enum.FAILED,
            "W:bundle failed (MaybeThrow)",
            "E:stage stage-2 failed: last error: java.lang.IllegalStateException: bad record 7");
    for (int i = 0; i < 2; i++) {
      try {
        if (i == 0) {
          result.waitUntilFinish();
        } else {
          result.waitUntilFinish(Duration.standardMinutes(1));
        }
        fail("waitUntilFinish returned for a FAILED job");
      } catch (Pipeline.PipelineExecutionException e) {
        assertTrue(e.getMessage(), e.getMessage().contains("Job job-1 failed on Weir"));
        assertTrue(
            e.getMessage(),
            e.getMessage().contains("java.lang.IllegalStateException: bad record 7"));
      }
    }
    assertEquals(PipelineResult.State.FAILED, result.getState());
    assertEquals(PipelineResult.State.FAILED, result.awaitTerminal(Duration.ZERO));
  }

  @Test
  public void jobMessagesGoToTheConsoleNotBackToWeirWhileALoopbackHarnessLogs() throws Exception {
    java.util.logging.Logger root = java.util.logging.LogManager.getLogManager().getLogger("");
    java.util.logging.Handler[] before = root.getHandlers();
    org.apache.beam.fn.harness.logging.FakeHarnessLogHandler harness =
        new org.apache.beam.fn.harness.logging.FakeHarnessLogHandler();
    java.io.PrintStream err = System.err;
    java.io.ByteArrayOutputStream console = new java.io.ByteArrayOutputStream();
    for (java.util.logging.Handler h : before) {
      root.removeHandler(h);
    }
    root.addHandler(harness);
    System.setErr(new java.io.PrintStream(console, true, "UTF-8"));
    try {
      WeirPipelineResult result = job(JobState.Enum.DONE, "W:the side input is large");
      assertEquals(PipelineResult.State.DONE, result.waitUntilFinish());
    } finally {
      System.setErr(err);
      root.removeHandler(harness);
      for (java.util.logging.Handler h : before) {
        root.addHandler(h);
      }
    }
    String printed = console.toString("UTF-8");
    assertTrue(printed, printed.contains("WARNING [job job-1] the side input is large"));
    for (String entry : harness.sent) {
      assertTrue(entry, !entry.contains("the side input is large"));
    }
  }

  @Test
  public void failedJobWithoutErrorNamesTheWarnings() throws Exception {
    WeirPipelineResult result = job(JobState.Enum.FAILED, "W:the SDK said no");
    try {
      result.waitUntilFinish();
      fail("waitUntilFinish returned for a FAILED job");
    } catch (Pipeline.PipelineExecutionException e) {
      assertTrue(e.getMessage(), e.getMessage().contains("the SDK said no"));
    }
  }

  @Test
  public void doneJobReturnsAndNamesMetricStepsByUniqueName() throws Exception {
    WeirPipelineResult result = job(JobState.Enum.DONE);
    assertEquals(PipelineResult.State.DONE, result.waitUntilFinish());
    assertEquals(
        "Step/ParMultiDo(Fn)",
        result
            .metrics()
            .queryMetrics(MetricsFilter.builder().addStep("Step").build())
            .getCounters()
            .iterator()
            .next()
            .getKey()
            .stepName());
  }

  @Test
  public void cancelledJobDoesNotThrow() throws Exception {
    assertEquals(PipelineResult.State.CANCELLED, job(JobState.Enum.CANCELLED).waitUntilFinish());
  }
}
