package dev.weir.runner;

import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import org.apache.beam.model.jobmanagement.v1.JobApi;
import org.apache.beam.model.jobmanagement.v1.JobApi.JobMessage;
import org.apache.beam.model.jobmanagement.v1.JobServiceGrpc;
import org.apache.beam.sdk.Pipeline;
import org.apache.beam.sdk.PipelineResult;
import org.apache.beam.sdk.metrics.MetricResults;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.Channel;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.ManagedChannel;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.StatusRuntimeException;
import org.checkerframework.checker.nullness.qual.Nullable;
import org.joda.time.Duration;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The result of a job submitted by {@link WeirRunner}: its state (from the Job API's {@code
 * GetMessageStream}, falling back to {@code GetState}), its messages (logged here and kept when
 * they are warnings or errors), {@link #cancel()} ({@code CancelJob}) and {@link #metrics()}
 * ({@code GetJobMetrics}).
 *
 * <p>When the job reaches a terminal state the result fetches the job's metrics once, then
 * releases what the run held: the Job API channel, the LOOPBACK worker pool (which gives this
 * JVM back the logging its SDK harnesses sent to Weir) and a {@code weir serve} the runner
 * started, in that order. Later {@link #metrics()} calls answer from that copy.
 *
 * <p>{@link #waitUntilFinish()} throws a {@link Pipeline.PipelineExecutionException} when the job
 * FAILED, as Beam's DirectRunner does; its message carries the job's error messages (the SDK's
 * exception and stack trace). {@link #getState()} still answers FAILED.
 *
 * <p>Metric step names are the transforms' full names ({@code Outer/ParMultiDo(Fn)}), as on
 * DirectRunner, so that {@code MetricsFilter} steps match them.
 */
public final class WeirPipelineResult implements PipelineResult {
  private static final Logger LOG = LoggerFactory.getLogger(WeirPipelineResult.class);
  private static final int MAX_KEPT_MESSAGES = 200;

  private final String jobId;
  private final ManagedChannel channel;
  private final JobServiceGrpc.JobServiceBlockingStub jobService;
  private final List<AutoCloseable> resources;
  private final Map<String, String> transformNames;
  private final CompletableFuture<State> terminal = new CompletableFuture<>();
  private final List<String> problems = new ArrayList<>();
  private volatile State state = State.RUNNING;
  private volatile @Nullable MetricResults finalMetrics;
  private boolean released;

  /**
   * @param transformNames each transform id of the submitted pipeline to its unique name: metric
   *     steps are reported by these names
   */
  WeirPipelineResult(
      String jobId,
      ManagedChannel channel,
      Channel calls,
      List<AutoCloseable> resources,
      Map<String, String> transformNames) {
    this.jobId = jobId;
    this.channel = channel;
    this.jobService = JobServiceGrpc.newBlockingStub(calls);
    this.resources = resources;
    this.transformNames = transformNames;
    Thread watcher = new Thread(this::watch, "weir-job-" + jobId);
    watcher.setDaemon(true);
    watcher.start();
  }

  /** The job id Weir gave the job ({@code RunJobResponse.job_id}). */
  public String getJobId() {
    return jobId;
  }

  /**
   * The job's warning and error messages seen so far (the last {@value #MAX_KEPT_MESSAGES}), each
   * as {@code IMPORTANCE: text}.
   */
  public synchronized List<String> getProblems() {
    return new ArrayList<>(problems);
  }

  /** Maps a Job API state to Beam's; DRAINED counts as DONE, DRAINING and CANCELLING as RUNNING. */
  static State toBeamState(JobApi.JobState.Enum s) {
    switch (s) {
      case STOPPED:
        return State.STOPPED;
      case STARTING:
      case RUNNING:
      case DRAINING:
      case CANCELLING:
      case UPDATING:
        return State.RUNNING;
      case DONE:
      case DRAINED:
        return State.DONE;
      case FAILED:
        return State.FAILED;
      case CANCELLED:
        return State.CANCELLED;
      case UPDATED:
        return State.UPDATED;
      default:
        return State.UNKNOWN;
    }
  }

  private void watch() {
    try {
      Iterator<JobApi.JobMessagesResponse> stream =
          jobService.getMessageStream(
              JobApi.JobMessagesRequest.newBuilder().setJobId(jobId).build());
      while (stream.hasNext() && !terminal.isDone()) {
        JobApi.JobMessagesResponse r = stream.next();
        if (r.hasMessageResponse()) {
          onMessage(r.getMessageResponse());
        } else if (r.hasStateResponse()) {
          onState(r.getStateResponse().getState());
        }
      }
    } catch (StatusRuntimeException e) {
      LOG.debug("message stream of job {} ended: {}", jobId, e.getStatus());
    } catch (RuntimeException e) {
      LOG.warn("message stream of job {} failed", jobId, e);
    }
    // The stream ended without a terminal state: poll.
    while (!terminal.isDone()) {
      try {
        onState(
            jobService
                .withDeadlineAfter(30, TimeUnit.SECONDS)
                .getState(JobApi.GetJobStateRequest.newBuilder().setJobId(jobId).build())
                .getState());
        Thread.sleep(500);
      } catch (StatusRuntimeException e) {
        synchronized (this) {
          problems.add("JOB_MESSAGE_ERROR: lost the job service: " + e.getStatus());
        }
        finish(State.UNKNOWN);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return;
      }
    }
  }

  private void onMessage(JobMessage m) {
    String text = m.getMessageText();
    if (LoopbackWorkerPool.harnessOwnsLogging()) {
      // A LOOPBACK SDK harness in this JVM sends java.util.logging to Weir while it runs: logged
      // there, the message would go back to the job's log and never reach this console.
      switch (m.getImportance()) {
        case JOB_MESSAGE_ERROR:
          System.err.println("ERROR [job " + jobId + "] " + text);
          keep(m);
          return;
        case JOB_MESSAGE_WARNING:
          System.err.println("WARNING [job " + jobId + "] " + text);
          keep(m);
          return;
        case JOB_MESSAGE_BASIC:
          if (LOG.isInfoEnabled()) {
            System.err.println("INFO [job " + jobId + "] " + text);
          }
          return;
        default:
          return;
      }
    }
    switch (m.getImportance()) {
      case JOB_MESSAGE_ERROR:
        LOG.error("[job {}] {}", jobId, text);
        keep(m);
        break;
      case JOB_MESSAGE_WARNING:
        LOG.warn("[job {}] {}", jobId, text);
        keep(m);
        break;
      case JOB_MESSAGE_BASIC:
        LOG.info("[job {}] {}", jobId, text);
        break;
      default:
        LOG.debug("[job {}] {}", jobId, text);
    }
  }

  private synchronized void keep(JobMessage m) {
    if (problems.size() >= MAX_KEPT_MESSAGES) {
      problems.remove(0);
    }
    problems.add(m.getImportance().name() + ": " + m.getMessageText());
  }

  private void onState(JobApi.JobState.Enum s) {
    State beam = toBeamState(s);
    state = beam;
    if (beam.isTerminal()) {
      finish(beam);
    }
  }

  private void finish(State s) {
    state = s;
    MetricResults metrics = fetchMetrics();
    if (metrics != null) {
      finalMetrics = metrics;
    }
    release();
    if (s == State.FAILED) {
      // Said again now that this JVM's logging, which LOOPBACK harnesses redirect to Weir while
      // they run, is restored (release() closed the worker pool).
      LOG.error("Job {} failed:\n{}", jobId, String.join("\n", getProblems()));
    }
    terminal.complete(s);
  }

  private @Nullable MetricResults fetchMetrics() {
    try {
      return new WeirMetrics(
          jobService
              .withDeadlineAfter(60, TimeUnit.SECONDS)
              .getJobMetrics(JobApi.GetJobMetricsRequest.newBuilder().setJobId(jobId).build())
              .getMetrics(),
          transformNames);
    } catch (StatusRuntimeException e) {
      LOG.warn("GetJobMetrics for job {} failed: {}", jobId, e.getStatus());
      return null;
    }
  }

  private synchronized void release() {
    if (released) {
      return;
    }
    released = true;
    channel.shutdownNow();
    WeirRunner.closeAll(resources);
  }

  @Override
  public State getState() {
    return state;
  }

  /**
   * Asks Weir to cancel the job ({@code CancelJob}) and waits (at most 5 minutes) until it is
   * terminal; returns the state then.
   */
  @Override
  public State cancel() {
    if (!terminal.isDone()) {
      try {
        jobService
            .withDeadlineAfter(60, TimeUnit.SECONDS)
            .cancel(JobApi.CancelJobRequest.newBuilder().setJobId(jobId).build());
      } catch (StatusRuntimeException e) {
        if (!terminal.isDone()) {
          throw new RuntimeException("CancelJob " + jobId + " failed: " + e.getStatus(), e);
        }
      }
    }
    State s = awaitTerminal(Duration.standardMinutes(5));
    return s == null ? state : s;
  }

  /**
   * Waits at most {@code duration} (forever when null or not positive) for a terminal state.
   *
   * @return the terminal state, or null if the job is still running after {@code duration}
   * @throws Pipeline.PipelineExecutionException if the job FAILED, with the job's error messages
   */
  @Override
  public @Nullable State waitUntilFinish(@Nullable Duration duration) {
    State s = awaitTerminal(duration);
    if (s == State.FAILED) {
      throw new Pipeline.PipelineExecutionException(new RuntimeException(failureMessage()));
    }
    return s;
  }

  /** The message of the exception {@link #waitUntilFinish} throws for a FAILED job. */
  String failureMessage() {
    List<String> errors = new ArrayList<>();
    List<String> warnings = new ArrayList<>();
    for (String p : getProblems()) {
      (p.startsWith("JOB_MESSAGE_ERROR: ") ? errors : warnings).add(p.substring(p.indexOf(':') + 2));
    }
    StringBuilder m = new StringBuilder("Job ").append(jobId).append(" failed on Weir");
    if (!errors.isEmpty()) {
      m.append(": ").append(String.join("\n", errors));
    } else if (!warnings.isEmpty()) {
      // No error message: the last warnings (the SDK's failures) say what went wrong.
      m.append("; its last warnings:\n")
          .append(String.join("\n", warnings.subList(Math.max(0, warnings.size() - 3), warnings.size())));
    } else {
      m.append(" (Weir sent no error message)");
    }
    return m.toString();
  }

  /** {@link #waitUntilFinish(Duration)} without the exception for a FAILED job. */
  @Nullable
  State awaitTerminal(@Nullable Duration duration) {
    try {
      if (duration == null || duration.getMillis() <= 0) {
        return terminal.get();
      }
      return terminal.get(duration.getMillis(), TimeUnit.MILLISECONDS);
    } catch (TimeoutException e) {
      return null;
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return null;
    } catch (ExecutionException e) {
      throw new RuntimeException(e.getCause());
    }
  }

  /**
   * Waits for a terminal state.
   *
   * @throws Pipeline.PipelineExecutionException if the job FAILED, with the job's error messages
   */
  @Override
  public State waitUntilFinish() {
    State s = waitUntilFinish(Duration.ZERO);
    return s == null ? state : s;
  }

  /**
   * The job's user metrics: the final values once the job is terminal, else a fresh {@code
   * GetJobMetrics}.
   */
  @Override
  public MetricResults metrics() {
    MetricResults cached = finalMetrics;
    if (cached != null) {
      return cached;
    }
    if (terminal.isDone()) {
      return WeirMetrics.empty();
    }
    MetricResults now = fetchMetrics();
    return now == null ? WeirMetrics.empty() : now;
  }

  @Override
  public String toString() {
    return "WeirPipelineResult{job=" + jobId + ", state=" + state + "}";
  }
}
