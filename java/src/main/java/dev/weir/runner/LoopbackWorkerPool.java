package dev.weir.runner;

import java.util.Collections;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.logging.Handler;
import java.util.logging.LogManager;
import org.apache.beam.fn.harness.Caches;
import org.apache.beam.fn.harness.FnHarness;
import org.apache.beam.fn.harness.stream.HarnessStreamObserverFactories;
import org.apache.beam.model.fnexecution.v1.BeamFnApi.StartWorkerRequest;
import org.apache.beam.model.fnexecution.v1.BeamFnApi.StartWorkerResponse;
import org.apache.beam.model.fnexecution.v1.BeamFnApi.StopWorkerRequest;
import org.apache.beam.model.fnexecution.v1.BeamFnApi.StopWorkerResponse;
import org.apache.beam.model.fnexecution.v1.BeamFnExternalWorkerPoolGrpc;
import org.apache.beam.model.fnexecution.v1.ProvisionApi;
import org.apache.beam.model.fnexecution.v1.ProvisionServiceGrpc;
import org.apache.beam.model.pipeline.v1.Endpoints.ApiServiceDescriptor;
import org.apache.beam.sdk.fn.channel.AddHarnessIdInterceptor;
import org.apache.beam.sdk.fn.channel.ManagedChannelFactory;
import org.apache.beam.sdk.fn.server.FnService;
import org.apache.beam.sdk.fn.server.GrpcFnServer;
import org.apache.beam.sdk.fn.server.ServerFactory;
import org.apache.beam.sdk.options.ExperimentalOptions;
import org.apache.beam.sdk.options.PipelineOptions;
import org.apache.beam.sdk.util.construction.PipelineOptionsTranslation;
import org.apache.beam.vendor.grpc.v1p69p0.com.google.protobuf.Struct;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.ManagedChannel;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.stub.StreamObserver;
import org.checkerframework.checker.nullness.qual.Nullable;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The LOOPBACK worker pool: Beam's {@code BeamFnExternalWorkerPool} service, starting an SDK harness
 * ({@link FnHarness}) thread in this JVM for each {@code StartWorker} request, as Beam's {@code
 * ExternalWorkerService} does, with these differences:
 *
 * <ul>
 *   <li>Each harness gets its own copy of the pipeline options as sent to Weir ({@link
 *       #setPipelineOptions}), as a PROCESS or EXTERNAL worker would: the harness stores values
 *       into its options (an executor, {@code java.time.Duration} defaults) that must not end up
 *       in the caller's options object, which may be used for another run.
 *   <li>The channel to the provision service is shut down after use.
 *   <li>{@link #close()} (called when the job is terminal, before {@code waitUntilFinish}
 *       returns) restores this JVM's logging, which a harness redirects to Weir while it runs
 *       ({@code BeamFnLoggingClient} replaces the root {@code java.util.logging} handlers and
 *       restores the configuration only when it ends).
 * </ul>
 */
final class LoopbackWorkerPool extends BeamFnExternalWorkerPoolGrpc.BeamFnExternalWorkerPoolImplBase
    implements FnService {
  private static final Logger LOG = LoggerFactory.getLogger(LoopbackWorkerPool.class);

  /** The pools of this JVM not closed yet (their jobs are not terminal). */
  private static final Set<LoopbackWorkerPool> OPEN = ConcurrentHashMap.newKeySet();

  /** This pool's harness threads that are still running. */
  private final Set<Thread> harnesses = ConcurrentHashMap.newKeySet();

  private volatile @Nullable Struct options;

  private LoopbackWorkerPool() {}

  /** Starts a pool on a free local port. */
  static GrpcFnServer<LoopbackWorkerPool> start() throws Exception {
    LoopbackWorkerPool pool = new LoopbackWorkerPool();
    OPEN.add(pool);
    try {
      return GrpcFnServer.allocatePortAndCreateFor(pool, ServerFactory.createDefault());
    } catch (Exception e) {
      OPEN.remove(pool);
      throw e;
    }
  }

  /** The options the harnesses get a copy of: those sent to Weir with the pipeline. */
  void setPipelineOptions(Struct options) {
    this.options = options;
  }

  @Override
  public void startWorker(
      StartWorkerRequest request, StreamObserver<StartWorkerResponse> responseObserver) {
    String id = request.getWorkerId();
    LOG.debug("Starting SDK harness {} for {}", id, request.getControlEndpoint().getUrl());
    Struct proto = options;
    if (proto == null) {
      responseObserver.onNext(
          StartWorkerResponse.newBuilder().setError("the job's pipeline options are not set").build());
      responseObserver.onCompleted();
      return;
    }
    PipelineOptions harnessOptions;
    Set<String> capabilities;
    ApiServiceDescriptor control = request.getControlEndpoint();
    ApiServiceDescriptor logging = request.getLoggingEndpoint();
    try {
      harnessOptions = PipelineOptionsTranslation.fromProto(proto);
      capabilities = Collections.emptySet();
      if (request.hasProvisionEndpoint()) {
        ProvisionApi.ProvisionInfo info = provisionInfo(id, request.getProvisionEndpoint());
        capabilities = Set.copyOf(info.getRunnerCapabilitiesList());
        if (info.hasControlEndpoint()) {
          control = info.getControlEndpoint();
        }
        if (info.hasLoggingEndpoint()) {
          logging = info.getLoggingEndpoint();
        }
      }
    } catch (RuntimeException e) {
      LOG.warn("cannot start SDK harness {}", id, e);
      responseObserver.onNext(StartWorkerResponse.newBuilder().setError(e.toString()).build());
      responseObserver.onCompleted();
      return;
    }
    ApiServiceDescriptor controlEndpoint = control;
    ApiServiceDescriptor loggingEndpoint = logging;
    Set<String> runnerCapabilities = capabilities;
    Thread thread =
        new Thread(
            () -> {
              try {
                runHarness(
                    id, harnessOptions, runnerCapabilities, loggingEndpoint, controlEndpoint);
              } catch (Exception e) {
                LOG.error("SDK harness {} failed", id, e);
              } finally {
                harnesses.remove(Thread.currentThread());
              }
            },
            "SDK-worker-" + id);
    thread.setDaemon(true);
    harnesses.add(thread);
    thread.start();
    responseObserver.onNext(StartWorkerResponse.getDefaultInstance());
    responseObserver.onCompleted();
  }

  private static ProvisionApi.ProvisionInfo provisionInfo(String id, ApiServiceDescriptor endpoint) {
    ManagedChannel channel =
        ManagedChannelFactory.createDefault()
            .withInterceptors(List.of(AddHarnessIdInterceptor.create(id)))
            .forDescriptor(endpoint);
    try {
      return ProvisionServiceGrpc.newBlockingStub(channel)
          .withDeadlineAfter(60, TimeUnit.SECONDS)
          .getProvisionInfo(ProvisionApi.GetProvisionInfoRequest.getDefaultInstance())
          .getInfo();
    } finally {
      channel.shutdownNow();
    }
  }

  /** {@link FnHarness#main} as Beam's ExternalWorkerService calls it. */
  private static void runHarness(
      String id,
      PipelineOptions options,
      Set<String> capabilities,
      ApiServiceDescriptor logging,
      ApiServiceDescriptor control)
      throws Exception {
    ManagedChannelFactory channels =
        ExperimentalOptions.hasExperiment(options, "beam_fn_api_epoll")
            ? ManagedChannelFactory.createEpoll()
            : ManagedChannelFactory.createDefault();
    FnHarness.main(
        id,
        options,
        capabilities,
        logging,
        control,
        null,
        channels,
        HarnessStreamObserverFactories.fromOptions(options),
        Caches.fromOptions(options));
  }

  @Override
  public void stopWorker(
      StopWorkerRequest request, StreamObserver<StopWorkerResponse> responseObserver) {
    // A harness ends when Weir closes its control stream.
    responseObserver.onNext(StopWorkerResponse.getDefaultInstance());
    responseObserver.onCompleted();
  }

  /**
   * Stops taking workers and, unless a harness of another pool of this JVM (another job) is
   * running, restores this JVM's logging configuration now: this pool's harnesses end by
   * themselves shortly after Weir closes their control streams (about 1 s, as the harness polls
   * its log queue once a second) and restore it again then.
   */
  @Override
  public void close() {
    OPEN.remove(this);
    for (LoopbackWorkerPool other : OPEN) {
      if (!other.harnesses.isEmpty()) {
        LOG.debug("another job's LOOPBACK SDK harness is running: logging stays as it is");
        return;
      }
    }
    restoreLogging();
  }

  /**
   * Whether a LOOPBACK SDK harness has replaced this JVM's root {@code java.util.logging}
   * handlers with its own, which send entries to Weir (while it runs).
   */
  static boolean harnessOwnsLogging() {
    java.util.logging.Logger root = LogManager.getLogManager().getLogger("");
    for (Handler h : root.getHandlers()) {
      if (isHarnessHandler(h)) {
        return true;
      }
    }
    return false;
  }

  private static boolean isHarnessHandler(Handler h) {
    return h.getClass().getName().startsWith("org.apache.beam.fn.harness.logging.");
  }

  /**
   * Removes the SDK harness's log handlers ({@code BeamFnLoggingClient}'s, which send to Weir)
   * from the root logger and rereads the logging configuration, as the harness does when it ends.
   */
  static void restoreLogging() {
    java.util.logging.Logger root = LogManager.getLogManager().getLogger("");
    boolean redirected = false;
    for (Handler h : root.getHandlers()) {
      if (isHarnessHandler(h)) {
        root.removeHandler(h);
        redirected = true;
      }
    }
    if (!redirected) {
      return;
    }
    try {
      LogManager.getLogManager().readConfiguration();
    } catch (java.io.IOException | RuntimeException e) {
      System.err.println("Weir: cannot restore the logging configuration: " + e);
    }
  }
}
