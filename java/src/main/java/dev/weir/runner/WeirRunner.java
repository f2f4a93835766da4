package dev.weir.runner;

import java.io.File;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.apache.beam.model.jobmanagement.v1.ArtifactStagingServiceGrpc;
import org.apache.beam.model.jobmanagement.v1.JobApi;
import org.apache.beam.model.jobmanagement.v1.JobServiceGrpc;
import org.apache.beam.model.pipeline.v1.Endpoints.ApiServiceDescriptor;
import org.apache.beam.model.pipeline.v1.RunnerApi;
import org.apache.beam.runners.fnexecution.artifact.ArtifactRetrievalService;
import org.apache.beam.runners.fnexecution.artifact.ArtifactStagingService;
import org.apache.beam.sdk.Pipeline;
import org.apache.beam.sdk.PipelineResult;
import org.apache.beam.sdk.PipelineRunner;
import org.apache.beam.sdk.fn.channel.ManagedChannelFactory;
import org.apache.beam.sdk.fn.server.GrpcFnServer;
import org.apache.beam.sdk.options.PipelineOptions;
import org.apache.beam.sdk.util.construction.DefaultArtifactResolver;
import org.apache.beam.sdk.util.construction.Environments;
import org.apache.beam.sdk.util.construction.PipelineOptionsTranslation;
import org.apache.beam.sdk.util.construction.PipelineTranslation;
import org.apache.beam.sdk.util.construction.SdkComponents;
import org.apache.beam.sdk.util.construction.resources.PipelineResources;
import org.apache.beam.vendor.grpc.v1p69p0.com.google.protobuf.Struct;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.Channel;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.ClientInterceptors;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.ConnectivityState;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.ManagedChannel;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.Metadata;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.Status;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.stub.MetadataUtils;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.StatusRuntimeException;
import org.checkerframework.checker.nullness.qual.Nullable;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Runs a Beam Java pipeline on Weir, a portable runner, through Beam's Job API.
 *
 * <p>{@link #run} translates the pipeline with the Java SDK's own translation ({@link
 * PipelineTranslation#toProto}, environments from {@link
 * Environments#createOrGetDefaultEnvironment}, options from {@link PipelineOptionsTranslation}),
 * then calls {@code Prepare}, offers the environment's artifacts (the classpath jars) to Weir's
 * {@code ArtifactStagingService} by reverse retrieval, calls {@code Run} and returns a {@link
 * WeirPipelineResult} that follows the job.
 *
 * <p>Environments ({@code --defaultEnvironmentType}):
 *
 * <ul>
 *   <li>{@code LOOPBACK} (default): a worker pool in this JVM ({@link LoopbackWorkerPool}) starts
 *       SDK harness threads when Weir asks for workers; nothing is staged unless {@code
 *       --filesToStage} says so.
 *   <li>{@code EXTERNAL}: a worker pool at {@code --defaultEnvironmentConfig=host:port}.
 *   <li>{@code PROCESS}: Weir runs {@code --defaultEnvironmentConfig}'s command; without one, {@code
 *       {"command": "<weir> boot --java"}}, Weir's own boot of the Java harness.
 * </ul>
 *
 * <p>Without {@code --jobEndpoint} the runner starts a {@link WeirServer} for the job and stops it
 * when the job ends.
 */
public class WeirRunner extends PipelineRunner<PipelineResult> {
  private static final Logger LOG = LoggerFactory.getLogger(WeirRunner.class);

  /**
   * How long to wait for a connection to {@code --jobEndpoint} before calling it unreachable: a
   * server that is just starting has this long to listen.
   */
  static final int CONNECT_TIMEOUT_SECONDS = 5;

  private final WeirPipelineOptions options;

  protected WeirRunner(WeirPipelineOptions options) {
    this.options = options;
  }

  /** Creates the runner; Beam calls this for {@code --runner=WeirRunner}. */
  public static WeirRunner fromOptions(PipelineOptions options) {
    // Not PipelineOptionsValidator: PortablePipelineOptions marks --jobEndpoint required, and
    // Weir starts a server when it is absent.
    return new WeirRunner(options.as(WeirPipelineOptions.class));
  }

  @Override
  public PipelineResult run(Pipeline pipeline) {
    List<AutoCloseable> resources = new ArrayList<>();
    try {
      return submit(pipeline, resources);
    } catch (RuntimeException e) {
      closeAll(resources);
      throw e;
    }
  }

  private WeirPipelineResult submit(Pipeline pipeline, List<AutoCloseable> resources) {
    String endpoint = options.getJobEndpoint();
    boolean started = false;
    if (endpoint == null || endpoint.isEmpty()) {
      String binary = WeirServer.findBinary(options.getWeirBinary());
      try {
        WeirServer server = WeirServer.start(binary, options.getWeirStartupTimeoutSeconds());
        resources.add(server);
        endpoint = server.getEndpoint();
        started = true;
      } catch (java.io.IOException e) {
        throw new RuntimeException("cannot start Weir: " + e.getMessage(), e);
      }
    }

    LoopbackWorkerPool pool = prepareEnvironment(resources);

    RunnerApi.Pipeline proto = PipelineTranslation.toProto(pipeline, SdkComponents.create(options));
    proto = DefaultArtifactResolver.INSTANCE.resolveArtifacts(proto);
    Struct optionsProto = PipelineOptionsTranslation.toProto(options);
    if (pool != null) {
      pool.setPipelineOptions(optionsProto);
    }
    JobApi.PrepareJobRequest prepare =
        JobApi.PrepareJobRequest.newBuilder()
            .setJobName(options.getJobName())
            .setPipeline(proto)
            .setPipelineOptions(optionsProto)
            .build();

    ManagedChannelFactory channels = ManagedChannelFactory.createDefault();
    ManagedChannel channel =
        channels.forDescriptor(ApiServiceDescriptor.newBuilder().setUrl(endpoint).build());
    Channel calls = withToken(channel, options.getWeirAuthToken());
    JobServiceGrpc.JobServiceBlockingStub jobService = JobServiceGrpc.newBlockingStub(calls);
    try {
      // A server this runner started is listening already; another one gets a few seconds to
      // answer, then Prepare fails at once (no waitForReady) with the connection's error.
      boolean connected = started || awaitConnected(channel, CONNECT_TIMEOUT_SECONDS);
      int timeout = options.getJobServerTimeout();
      JobApi.PrepareJobResponse prepared;
      try {
        JobServiceGrpc.JobServiceBlockingStub stub =
            jobService.withDeadlineAfter(timeout, TimeUnit.SECONDS);
        prepared = (connected ? stub.withWaitForReady() : stub).prepare(prepare);
      } catch (StatusRuntimeException e) {
        if (!connected && e.getStatus().getCode() == Status.Code.UNAVAILABLE) {
          throw new RuntimeException(unreachable(endpoint, e.getStatus()), e);
        }
        throw new RuntimeException(
            "Weir at " + endpoint + " refused the pipeline (Prepare): " + e.getStatus(), e);
      }
      stageArtifacts(channels, prepared, options.getWeirAuthToken());
      JobApi.RunJobResponse run;
      try {
        run =
            jobService.run(
                JobApi.RunJobRequest.newBuilder()
                    .setPreparationId(prepared.getPreparationId())
                    .build());
      } catch (StatusRuntimeException e) {
        throw new RuntimeException("Weir at " + endpoint + " did not run the job: " + e.getStatus(), e);
      }
      LOG.info("Submitted job {} to Weir at {}", run.getJobId(), endpoint);
      return new WeirPipelineResult(
          run.getJobId(), channel, calls, resources, transformNames(proto));
    } catch (RuntimeException e) {
      channel.shutdownNow();
      throw e;
    }
  }

  /** The message for a {@code --jobEndpoint} that does not answer. */
  static String unreachable(String endpoint, Status status) {
    StringBuilder m =
        new StringBuilder("cannot connect to a Weir job service at ")
            .append(endpoint)
            .append(": nothing answered within ")
            .append(CONNECT_TIMEOUT_SECONDS)
            .append(" s");
    String detail = status.getDescription();
    if (status.getCause() != null && status.getCause().getMessage() != null) {
      detail = (detail == null ? "" : detail + ": ") + status.getCause().getMessage();
    }
    if (detail != null && !detail.isEmpty()) {
      m.append(" (").append(detail).append(")");
    }
    return m.append(
            ". Is `weir serve` running there? Give --jobEndpoint=host:port of a running `weir"
                + " serve`, or leave --jobEndpoint out to have the runner start one.")
        .toString();
  }

  /**
   * Waits at most {@code seconds} for {@code channel} to connect, reconnecting at once after each
   * failed attempt (a server that is starting is found as soon as it listens).
   *
   * @return whether it connected
   */
  static boolean awaitConnected(ManagedChannel channel, int seconds) {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(seconds);
    ConnectivityState state = channel.getState(true);
    while (state != ConnectivityState.READY) {
      long left = deadline - System.nanoTime();
      if (left <= 0 || state == ConnectivityState.SHUTDOWN) {
        return false;
      }
      if (state == ConnectivityState.TRANSIENT_FAILURE) {
        channel.resetConnectBackoff();
      }
      CompletableFuture<Void> changed = new CompletableFuture<>();
      channel.notifyWhenStateChanged(state, () -> changed.complete(null));
      try {
        changed.get(Math.min(left, TimeUnit.MILLISECONDS.toNanos(250)), TimeUnit.NANOSECONDS);
      } catch (java.util.concurrent.TimeoutException e) {
        // Look again.
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return false;
      } catch (java.util.concurrent.ExecutionException e) {
        throw new IllegalStateException(e);
      }
      state = channel.getState(true);
    }
    return true;
  }

  /** Each transform's id in {@code pipeline} to its unique (full) name. */
  static Map<String, String> transformNames(RunnerApi.Pipeline pipeline) {
    Map<String, String> names = new HashMap<>();
    pipeline
        .getComponents()
        .getTransformsMap()
        .forEach(
            (id, t) -> {
              if (!t.getUniqueName().isEmpty()) {
                names.put(id, t.getUniqueName());
              }
            });
    return names;
  }

  /**
   * Completes the environment options: defaults to LOOPBACK (starting its worker pool), fills in
   * the PROCESS boot command, and decides which files to stage.
   */
  private @Nullable LoopbackWorkerPool prepareEnvironment(List<AutoCloseable> resources) {
    String type = options.getDefaultEnvironmentType();
    if (type == null || type.isEmpty()) {
      type = Environments.ENVIRONMENT_LOOPBACK;
      options.setDefaultEnvironmentType(type);
    }
    if (Environments.ENVIRONMENT_LOOPBACK.equals(type)) {
      GrpcFnServer<LoopbackWorkerPool> pool;
      try {
        pool = LoopbackWorkerPool.start();
      } catch (Exception e) {
        throw new RuntimeException("cannot start the LOOPBACK worker pool: " + e.getMessage(), e);
      }
      resources.add(pool);
      options.setDefaultEnvironmentConfig(pool.getApiServiceDescriptor().getUrl());
      LOG.info("LOOPBACK worker pool at {}", pool.getApiServiceDescriptor().getUrl());
      // The harness runs in this JVM: it needs no artifacts.
      if (options.getFilesToStage() == null) {
        options.setFilesToStage(List.of());
      }
      return pool.getService();
    }
    if (Environments.ENVIRONMENT_PROCESS.equals(type)
        && (options.getDefaultEnvironmentConfig() == null
            || options.getDefaultEnvironmentConfig().isEmpty())
        && options.getEnvironmentOptions() == null) {
      options.setDefaultEnvironmentConfig(defaultProcessConfig());
    }
    if (options.getFilesToStage() == null) {
      PipelineResources.prepareFilesForStaging(options);
    }
    return null;
  }

  /** {@code {"command": "<weir> boot --java [--java_harness_classpath=DIR]"}}, as JSON. */
  private String defaultProcessConfig() {
    String binary;
    try {
      binary = new File(WeirServer.findBinary(options.getWeirBinary())).getAbsolutePath();
    } catch (IllegalStateException noBinary) {
      throw new IllegalStateException(
          "No weir binary for the PROCESS environment: Weir starts its Java SDK harnesses with"
              + " `<weir> boot --java`, so PROCESS needs the path of a weir binary (on the machine"
              + " of the job service) even with --jobEndpoint: give --weirBinary=PATH, or set"
              + " WEIR_BIN, or put `weir` on the PATH, or give the boot command yourself with"
              + " --defaultEnvironmentConfig='{\"command\": \"...\"}'");
    }
    StringBuilder command = new StringBuilder(binary).append(" boot --java");
    String harness = options.getWeirJavaHarnessClasspath();
    if (harness != null && !harness.isEmpty()) {
      command.append(" --java_harness_classpath=").append(new File(harness).getAbsolutePath());
    }
    return "{\"command\": \"" + command.toString().replace("\\", "\\\\").replace("\"", "\\\"")
        + "\"}";
  }

  /**
   * {@code channel} sending {@code authorization: Bearer TOKEN} metadata on every call (what
   * {@code weir serve --auth_token} checks), or {@code channel} itself without a token.
   */
  static Channel withToken(Channel channel, String token) {
    if (token == null || token.trim().isEmpty()) {
      return channel;
    }
    Metadata headers = new Metadata();
    headers.put(
        Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER),
        "Bearer " + token.trim());
    return ClientInterceptors.intercept(
        channel, MetadataUtils.newAttachHeadersInterceptor(headers));
  }

  private static void stageArtifacts(
      ManagedChannelFactory channels, JobApi.PrepareJobResponse prepared, String token) {
    ManagedChannel staging = channels.forDescriptor(prepared.getArtifactStagingEndpoint());
    try {
      ArtifactStagingService.offer(
          new ArtifactRetrievalService(),
          ArtifactStagingServiceGrpc.newStub(withToken(staging, token)),
          prepared.getStagingSessionToken());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new RuntimeException("interrupted while staging artifacts", e);
    } catch (Exception e) {
      throw new RuntimeException("staging the job's artifacts failed: " + e.getMessage(), e);
    } finally {
      staging.shutdownNow();
    }
  }

  /**
   * Closes each of {@code resources}, the last one first (the LOOPBACK worker pool before the
   * {@code weir serve} its harnesses talk to), logging (not throwing) the failures.
   */
  static void closeAll(List<AutoCloseable> resources) {
    for (int i = resources.size() - 1; i >= 0; i--) {
      AutoCloseable r = resources.get(i);
      try {
        r.close();
      } catch (Exception e) {
        LOG.warn("closing {} failed", r, e);
      }
    }
  }

  @Override
  public String toString() {
    return "WeirRunner";
  }
}
