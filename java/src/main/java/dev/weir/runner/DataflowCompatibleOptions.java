package dev.weir.runner;

import java.util.List;
import java.util.Map;
import org.apache.beam.sdk.options.Description;
import org.apache.beam.sdk.options.PipelineOptions;
import org.checkerframework.checker.nullness.qual.Nullable;

/**
 * The Dataflow pipeline options Weir honours, validates or records (docs/pipeline-options.md) that
 * Beam Java's core interfaces do not declare, so that {@code --numWorkers=2}, {@code --region=...}
 * and the like parse with {@code --runner=WeirRunner} without Dataflow's runner jar. Beam's
 * translation sends each one set as {@code beam:option:<snake_case name>:v1}, where Weir reads it.
 *
 * <p>Getter names and types are Dataflow's ({@code DataflowPipelineOptions}, {@code
 * DataflowPipelineWorkerPoolOptions}, {@code DataflowPipelineDebugOptions}, {@code
 * DataflowProfilingOptions}, {@code DataflowWorkerLoggingOptions}), except that Dataflow's enums
 * are strings here and its logging and profiling maps plain maps; none has a default, so an option
 * the user did not set is not sent and Weir's own default applies. (A primitive getter read while
 * unset binds its zero value, which is then sent: {@code getNumWorkers()} gives 0, which Weir,
 * like Dataflow, reads as not set.) The options of Beam's {@code GcpOptions} are in {@link Gcp}.
 *
 * <p>{@link WeirRunnerRegistrar.Options} registers this interface only when Dataflow's runner jar
 * is not on the classpath, and {@link Gcp} only when Beam's Google Cloud Platform extension is not
 * either: those jars declare the same options themselves (Beam refuses one option declared twice
 * with different types or defaults), and they reach Weir under the same names.
 */
public interface DataflowCompatibleOptions extends PipelineOptions {

  /** Regional endpoint that runs the job; Weir records it ({@code beam:option:region:v1}). */
  @Description(
      "Regional endpoint that runs the job. Weir records beam:option:region:v1 (no local"
          + " meaning) with a note in the job's messages.")
  @Nullable
  String getRegion();

  void setRegion(@Nullable String value);

  /** Where the SDK stages the job's files ({@code beam:option:staging_location:v1}). */
  @Description(
      "Path where the SDK stages the job's files: a local path or a file://, gs:// or s3:// URL."
          + " Weir reads beam:option:staging_location:v1 and keeps the artifacts under"
          + " <location>/<job id>/.")
  @Nullable
  String getStagingLocation();

  void setStagingLocation(@Nullable String value);

  /** User labels of the job; Weir validates them ({@code beam:option:labels:v1}). */
  @Description(
      "User labels of the job, as JSON: --labels={\"team\":\"data\"}. Weir reads"
          + " beam:option:labels:v1, checks Dataflow's label rules and lists the labels in the"
          + " job's messages.")
  @Nullable
  Map<String, String> getLabels();

  void setLabels(@Nullable Map<String, String> value);

  /** Dataflow service options; recorded ({@code beam:option:dataflow_service_options:v1}). */
  @Description(
      "Options of the Dataflow service (enable_prime, min_num_workers=N, ...). Weir records"
          + " beam:option:dataflow_service_options:v1 with a note.")
  @Nullable
  List<String> getDataflowServiceOptions();

  void setDataflowServiceOptions(@Nullable List<String> value);

  /** Service account of the worker VMs; recorded ({@code beam:option:service_account:v1}). */
  @Description(
      "Service account the worker VMs run as. Weir records beam:option:service_account:v1 with a"
          + " note (SDK workers run as Weir's user).")
  @Nullable
  String getServiceAccount();

  void setServiceAccount(@Nullable String value);

  /** URL of the Dataflow API; Weir records it ({@code beam:option:dataflow_endpoint:v1}). */
  @Description(
      "URL of the Dataflow API. Weir records beam:option:dataflow_endpoint:v1 with a note (Weir"
          + " is the job service).")
  @Nullable
  String getDataflowEndpoint();

  void setDataflowEndpoint(@Nullable String value);

  /** Where to save the job as a template; recorded ({@code beam:option:template_location:v1}). */
  @Description(
      "Save the job as a template there instead of running it. Weir records"
          + " beam:option:template_location:v1 with a note and runs the job.")
  @Nullable
  String getTemplateLocation();

  void setTemplateLocation(@Nullable String value);

  /** Replace the running job of the same name; Weir records it ({@code beam:option:update:v1}). */
  @Description(
      "Replace the running job of the same name. Weir records beam:option:update:v1 with a note"
          + " and starts a new job.")
  boolean isUpdate();

  void setUpdate(boolean value);

  /** Dataflow snapshot to start from; recorded ({@code beam:option:create_from_snapshot:v1}). */
  @Description(
      "Start the job from this Dataflow snapshot. Weir records beam:option:create_from_snapshot:v1"
          + " with a note (it has no snapshots).")
  @Nullable
  String getCreateFromSnapshot();

  void setCreateFromSnapshot(@Nullable String value);

  /** Old-to-new transform names for --update ({@code beam:option:transform_name_mapping:v1}). */
  @Description(
      "Old-to-new transform names for --update, as JSON: {\"oldName\":\"newName\"}. Weir checks"
          + " and records beam:option:transform_name_mapping:v1 with a note.")
  @Nullable
  Map<String, String> getTransformNameMapping();

  void setTransformNameMapping(@Nullable Map<String, String> value);

  /** Custom Dataflow worker jar; Weir records it ({@code beam:option:dataflow_worker_jar:v1}). */
  @Description(
      "Custom Dataflow worker jar. Weir records beam:option:dataflow_worker_jar:v1 with a note"
          + " (there is no Dataflow worker).")
  @Nullable
  String getDataflowWorkerJar();

  void setDataflowWorkerJar(@Nullable String value);

  /** Flexible Resource Scheduling goal, a string here ({@code beam:option:flex_r_s_goal:v1}). */
  @Description(
      "Flexible Resource Scheduling goal: COST_OPTIMIZED, SPEED_OPTIMIZED or UNSPECIFIED (a"
          + " string here, Dataflow's enum FlexResourceSchedulingGoal). Weir checks and records"
          + " beam:option:flex_r_s_goal:v1 with a note.")
  @Nullable
  String getFlexRSGoal();

  void setFlexRSGoal(@Nullable String value);

  /** Initial number of workers; Weir sizes the job by it ({@code beam:option:num_workers:v1}). */
  @Description(
      "Initial number of workers (0: not set). Weir reads beam:option:num_workers:v1 and starts"
          + " that many workers' SDK harnesses per environment (default 1 worker); with"
          + " THROUGHPUT_BASED autoscaling it is the lower bound.")
  int getNumWorkers();

  void setNumWorkers(int value);

  /** Maximum number of workers under autoscaling ({@code beam:option:max_num_workers:v1}). */
  @Description(
      "Maximum number of workers, at least numWorkers. Weir reads beam:option:max_num_workers:v1"
          + " as the upper bound of THROUGHPUT_BASED autoscaling (default: numWorkers).")
  int getMaxNumWorkers();

  void setMaxNumWorkers(int value);

  /** Autoscaling mode, a string here ({@code beam:option:autoscaling_algorithm:v1}). */
  @Description(
      "Autoscaling mode: THROUGHPUT_BASED or NONE (a string here, Dataflow's enum"
          + " AutoscalingAlgorithmType). Weir reads beam:option:autoscaling_algorithm:v1:"
          + " THROUGHPUT_BASED scales SDK harnesses between numWorkers and maxNumWorkers by"
          + " backlog.")
  @Nullable
  String getAutoscalingAlgorithm();

  void setAutoscalingAlgorithm(@Nullable String value);

  /** Boot disk size of each worker in GB; Weir records it ({@code beam:option:disk_size_gb:v1}). */
  @Description(
      "Boot disk size of each worker, in GB (0: service default). Weir records"
          + " beam:option:disk_size_gb:v1 with a note (no worker VMs).")
  int getDiskSizeGb();

  void setDiskSizeGb(int value);

  /** Machine type of the workers; Weir records it ({@code beam:option:worker_machine_type:v1}). */
  @Description(
      "Compute Engine machine type of the workers. Weir records beam:option:worker_machine_type:v1"
          + " with a note (no worker VMs).")
  @Nullable
  String getWorkerMachineType();

  void setWorkerMachineType(@Nullable String value);

  /** Persistent disk type of the workers; recorded ({@code beam:option:worker_disk_type:v1}). */
  @Description(
      "Persistent disk type of the workers. Weir records beam:option:worker_disk_type:v1 with a"
          + " note (no worker VMs).")
  @Nullable
  String getWorkerDiskType();

  void setWorkerDiskType(@Nullable String value);

  /** VPC network of the worker VMs; Weir records it ({@code beam:option:network:v1}). */
  @Description(
      "VPC network of the worker VMs. Weir records beam:option:network:v1 with a note (no worker"
          + " VMs).")
  @Nullable
  String getNetwork();

  void setNetwork(@Nullable String value);

  /** Subnetwork of the worker VMs; Weir records it ({@code beam:option:subnetwork:v1}). */
  @Description(
      "Subnetwork of the worker VMs. Weir records beam:option:subnetwork:v1 with a note (no"
          + " worker VMs).")
  @Nullable
  String getSubnetwork();

  void setSubnetwork(@Nullable String value);

  /** Whether worker VMs get public IPs; Weir records it ({@code beam:option:use_public_ips:v1}). */
  @Description(
      "Whether worker VMs get public IP addresses. Weir records beam:option:use_public_ips:v1"
          + " with a note (no worker VMs).")
  @Nullable
  Boolean getUsePublicIps();

  void setUsePublicIps(@Nullable Boolean value);

  /** Minimum CPU platform of the workers; recorded ({@code beam:option:min_cpu_platform:v1}). */
  @Description(
      "Minimum CPU platform of the worker VMs. Weir records beam:option:min_cpu_platform:v1 with a"
          + " note (no worker VMs).")
  @Nullable
  String getMinCpuPlatform();

  void setMinCpuPlatform(@Nullable String value);

  /** Container image of the SDK harness ({@code beam:option:sdk_container_image:v1}). */
  @Description(
      "Container image of the SDK harness. Weir passes beam:option:sdk_container_image:v1 on to"
          + " SDK harnesses; Docker environments run the image the pipeline names.")
  @Nullable
  String getSdkContainerImage();

  void setSdkContainerImage(@Nullable String value);

  /** Deprecated sdkContainerImage ({@code beam:option:worker_harness_container_image:v1}). */
  @Description(
      "Deprecated name of sdkContainerImage. Weir passes"
          + " beam:option:worker_harness_container_image:v1 on to SDK harnesses.")
  @Nullable
  String getWorkerHarnessContainerImage();

  void setWorkerHarnessContainerImage(@Nullable String value);

  /** Log hot keys' values; Weir reads it ({@code beam:option:hot_key_logging_enabled:v1}). */
  @Description(
      "Log the literal value of hot keys. Weir reads beam:option:hot_key_logging_enabled:v1: its"
          + " hot-key warnings then show the key.")
  boolean isHotKeyLoggingEnabled();

  void setHotKeyLoggingEnabled(boolean value);

  /** Dump the heap when a worker runs out of memory ({@code beam:option:dump_heap_on_o_o_m:v1}). */
  @Description(
      "Dump the Java heap when a worker runs out of memory. Weir records"
          + " beam:option:dump_heap_on_o_o_m:v1 with a note.")
  boolean getDumpHeapOnOOM();

  void setDumpHeapOnOOM(boolean value);

  /** Cloud Storage path for heap dumps ({@code beam:option:save_heap_dumps_to_gcs_path:v1}). */
  @Description(
      "Cloud Storage path for heap dumps. Weir records beam:option:save_heap_dumps_to_gcs_path:v1"
          + " with a note.")
  @Nullable
  String getSaveHeapDumpsToGcsPath();

  void setSaveHeapDumpsToGcsPath(@Nullable String value);

  /** Container image overrides ({@code beam:option:sdk_harness_container_image_overrides:v1}). */
  @Description(
      "Replace container images of environments: regex,image pairs. Weir records"
          + " beam:option:sdk_harness_container_image_overrides:v1 with a note (not applied yet).")
  @Nullable
  String getSdkHarnessContainerImageOverrides();

  void setSdkHarnessContainerImageOverrides(@Nullable String value);

  /** Cloud Storage path for worker profiles ({@code beam:option:save_profiles_to_gcs:v1}). */
  @Description(
      "Cloud Storage path for worker profiles. Weir records beam:option:save_profiles_to_gcs:v1"
          + " with a note.")
  @Nullable
  String getSaveProfilesToGcs();

  void setSaveProfilesToGcs(@Nullable String value);

  /** Dataflow's profiling agent settings ({@code beam:option:profiling_agent_configuration:v1}). */
  @Description(
      "Configuration of Dataflow's profiling agent, as a JSON object. Weir records"
          + " beam:option:profiling_agent_configuration:v1 with a note.")
  @Nullable
  Map<String, Object> getProfilingAgentConfiguration();

  void setProfilingAgentConfiguration(@Nullable Map<String, Object> value);

  /** Default log level of the legacy worker ({@code beam:option:default_worker_log_level:v1}). */
  @Description(
      "Default log level of the legacy Dataflow Java worker: OFF, ERROR, WARN, INFO, DEBUG or"
          + " TRACE (a string here, Dataflow's enum Level). Weir records"
          + " beam:option:default_worker_log_level:v1 with a note; use defaultSdkHarnessLogLevel.")
  @Nullable
  String getDefaultWorkerLogLevel();

  void setDefaultWorkerLogLevel(@Nullable String value);

  /** Legacy worker log levels by logger ({@code beam:option:worker_log_level_overrides:v1}). */
  @Description(
      "Log levels of named loggers of the legacy Dataflow Java worker, as JSON"
          + " {\"a.b.C\":\"DEBUG\"}. Weir records beam:option:worker_log_level_overrides:v1 with a"
          + " note; use sdkHarnessLogLevelOverrides.")
  @Nullable
  Map<String, String> getWorkerLogLevelOverrides();

  void setWorkerLogLevelOverrides(@Nullable Map<String, String> value);

  /**
   * The Dataflow options that Beam's {@code GcpOptions} declares (in
   * beam-sdks-java-extensions-google-cloud-platform-core), with its getter names and types and
   * without its defaults.
   */
  interface Gcp extends PipelineOptions {

    /** Google Cloud project of the job; Weir records it ({@code beam:option:project:v1}). */
    @Description(
        "Google Cloud project that runs the job. Weir records beam:option:project:v1 with a note"
            + " and passes it to SDK harnesses, where Google Cloud connectors use it.")
    @Nullable
    String getProject();

    void setProject(@Nullable String value);

    /** Zone of the worker VMs, deprecated; Weir records it ({@code beam:option:zone:v1}). */
    @Description(
        "Zone of the worker VMs (deprecated: use workerZone). Weir records beam:option:zone:v1"
            + " with a note; not with workerRegion or workerZone.")
    @Nullable
    String getZone();

    void setZone(@Nullable String value);

    /** Region of the worker VMs; Weir records it ({@code beam:option:worker_region:v1}). */
    @Description(
        "Region of the worker VMs. Weir records beam:option:worker_region:v1 with a note; not"
            + " with zone or workerZone.")
    @Nullable
    String getWorkerRegion();

    void setWorkerRegion(@Nullable String value);

    /** Zone of the worker VMs; Weir records it ({@code beam:option:worker_zone:v1}). */
    @Description(
        "Zone of the worker VMs. Weir records beam:option:worker_zone:v1 with a note; not with"
            + " zone or workerRegion.")
    @Nullable
    String getWorkerZone();

    void setWorkerZone(@Nullable String value);

    /** Path for temporary files (Java); Weir uses it ({@code beam:option:gcp_temp_location:v1}). */
    @Description(
        "Path for temporary files: a local path or a file://, gs:// or s3:// URL. Weir reads"
            + " beam:option:gcp_temp_location:v1 as tempLocation when that is not set, and"
            + " <location>/staging as stagingLocation when that is not set.")
    @Nullable
    String getGcpTempLocation();

    void setGcpTempLocation(@Nullable String value);

    /** OAuth scopes of Google Cloud credentials ({@code beam:option:gcp_oauth_scopes:v1}). */
    @Description(
        "OAuth scopes of Google Cloud credentials. Weir passes beam:option:gcp_oauth_scopes:v1 to"
            + " SDK harnesses, whose Google Cloud clients request them.")
    @Nullable
    List<String> getGcpOauthScopes();

    void setGcpOauthScopes(@Nullable List<String> value);

    /** Service account to impersonate ({@code beam:option:impersonate_service_account:v1}). */
    @Description(
        "Service account (or delegation chain) to impersonate for API calls. Weir passes"
            + " beam:option:impersonate_service_account:v1 to SDK harnesses.")
    @Nullable
    String getImpersonateServiceAccount();

    void setImpersonateServiceAccount(@Nullable String value);

    /** Run streaming state in Streaming Engine ({@code beam:option:enable_streaming_engine:v1}). */
    @Description(
        "Run streaming state and shuffle in Dataflow's Streaming Engine. Weir records"
            + " beam:option:enable_streaming_engine:v1 with a note for streaming jobs (it keeps"
            + " state itself).")
    boolean isEnableStreamingEngine();

    void setEnableStreamingEngine(boolean value);

    /** Cloud KMS key of the job's data; recorded ({@code beam:option:dataflow_kms_key:v1}). */
    @Description(
        "Cloud KMS key that encrypts the job's state and shuffle data. Weir records"
            + " beam:option:dataflow_kms_key:v1 with a note.")
    @Nullable
    String getDataflowKmsKey();

    void setDataflowKmsKey(@Nullable String value);
  }
}
