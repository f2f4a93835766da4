//! Every Google Cloud Dataflow pipeline option Weir knows: its spellings in
//! the Python (and YAML), Java and Go SDKs, its type, its group in Dataflow's
//! reference, and what Weir does with it. `docs/pipeline-options.md` is the
//! readable form of this table; `DescribePipelineOptions` serves the
//! options of it the Python SDK does not define.

/// The type an option's value has (`PipelineOptionType` in the Job API).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptionType {
    String,
    Boolean,
    Integer,
    Number,
    Array,
    Object,
}

/// The groups of Dataflow's pipeline-options reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    Basic,
    ResourceUtilization,
    Debugging,
    SecurityAndNetworking,
    StreamingPipelineManagement,
    WorkerLevel,
}

impl Group {
    /// The group name served by `DescribePipelineOptions`.
    pub fn as_str(self) -> &'static str {
        match self {
            Group::Basic => "basic",
            Group::ResourceUtilization => "resource_utilization",
            Group::Debugging => "debugging",
            Group::SecurityAndNetworking => "security_and_networking",
            Group::StreamingPipelineManagement => "streaming_pipeline_management",
            Group::WorkerLevel => "worker_level",
        }
    }
}

/// What Weir does with an option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handling {
    /// Weir itself acts on the value.
    Honoured,
    /// The SDK acts on it: at pipeline construction, through staged
    /// artifacts, or in the SDK harness (every option reaches SDK harnesses
    /// through the provision service).
    Sdk,
    /// Checked by Weir (see [`super::validate`]); the value is kept in
    /// [`super::JobOptions`] and passed on to SDK harnesses.
    Validated,
    /// No local meaning yet: accepted (once its `rule` holds), kept with the
    /// job's options, and a note goes to the job's message stream when the
    /// option is set.
    Recorded,
}

/// One Dataflow pipeline option.
#[derive(Debug)]
pub struct OptionSpec {
    /// Canonical snake_case name (the Python name, or the snake_case form of
    /// the Java name for Java-only options).
    pub name: &'static str,
    /// Python / YAML spelling(s) ("" when the Python SDK has none).
    pub python: &'static str,
    /// Java spelling ("" when the Java SDK has none).
    pub java: &'static str,
    /// Go flag ("" when the Go SDK has none).
    pub go: &'static str,
    /// Further spellings accepted (aliases of the SDKs).
    pub aliases: &'static [&'static str],
    pub ty: OptionType,
    pub group: Group,
    pub handling: Handling,
    /// What the option means on Dataflow.
    pub description: &'static str,
    /// What Weir does with it; for `Recorded` options also the text of the
    /// note ("--name=value: <weir>").
    pub weir: &'static str,
    /// What Weir checks ("" when nothing beyond the value's type).
    pub rule: &'static str,
}

/// What Weir does with an option naming Python packages to install on the
/// workers (`setup_file`, `requirements_file`, `extra_packages`).
const INSTALLED_BY_WEIR_BOOT: &str = "The SDK stages the package; `weir boot --python` (PROCESS, and the substitute for Beam's Python image) pip-installs it before the SDK harness starts, as Beam's container boot does: from the staged files first, then with the package index for what they lack, into the worker's own folder (never into the interpreter's environment; packages the interpreter has count as installed), and that harness runs in a fresh interpreter rather than a fork of the fork server. A package that does not install fails the worker with pip's output in the job's log. LOOPBACK and EXTERNAL workers use their own environment, as on Beam's runners.";

macro_rules! spec {
    ($name:literal, py $py:literal, java $java:literal, go $go:literal, [$($alias:literal),*], $ty:ident, $group:ident, $handling:ident, $desc:literal, $weir:expr) => {
        OptionSpec {
            name: $name,
            python: $py,
            java: $java,
            go: $go,
            aliases: &[$($alias),*],
            ty: OptionType::$ty,
            group: Group::$group,
            handling: Handling::$handling,
            description: $desc,
            weir: $weir,
            rule: "",
        }
    };
    ($name:literal, py $py:literal, java $java:literal, go $go:literal, [$($alias:literal),*], $ty:ident, $group:ident, $handling:ident, $desc:literal, $weir:literal, rule $rule:literal) => {
        OptionSpec { rule: $rule, ..spec!($name, py $py, java $java, go $go, [$($alias),*], $ty, $group, $handling, $desc, $weir) }
    };
}

/// Every option, grouped as in Dataflow's reference.
pub static CATALOG: &[OptionSpec] = &[
    // ------------------------------------------------------------ basic
    spec!("job_name", py "job_name", java "jobName", go "job_name", [], String, Basic, Honoured,
        "Name of the job.",
        "Names the job (GetJobs, logs) when the PrepareJobRequest carries no name or Python's placeholder `job`.", rule "Any string; one Dataflow would reject (not `[a-z]([-a-z0-9]*[a-z0-9])?`) gets a note."),
    spec!("project", py "project", java "project", go "project", [], String, Basic, Recorded,
        "Google Cloud project that runs the job.",
        "has no local meaning for Weir (jobs run on this machine); recorded and passed to SDK harnesses, where Google Cloud connectors use it"),
    spec!("region", py "region", java "region", go "region", [], String, Basic, Recorded,
        "Regional endpoint that runs the job.",
        "has no local meaning (jobs run on this machine); recorded"),
    spec!("temp_location", py "temp_location", java "tempLocation", go "temp_location", [], String, Basic, Validated,
        "Path for temporary files.",
        "Opened and probed at Prepare (local folder, gs:// or s3://, through object_store) and passed to SDK harnesses, which write temporary files there; the staging location when staging_location is not set. A local folder outside Weir's own folders is the SDK's alone: the server neither makes nor probes it (unless weir serve --allow_client_staging_locations).", rule "A local path or a file://, gs:// or s3:// URL; a gs:// URL follows Dataflow's rule gs://BUCKET/OBJECT with a valid bucket name (3 or more lowercase letters, digits, -, _ or ., starting and ending with a letter or digit)."),
    spec!("gcp_temp_location", py "", java "gcpTempLocation", go "", [], String, Basic, Validated,
        "Cloud Storage path for temporary files (Java).",
        "Passed to SDK harnesses.", rule "A local path or a file://, gs:// or s3:// URL; a gs:// URL follows Dataflow's rule gs://BUCKET/OBJECT with a valid bucket name (3 or more lowercase letters, digits, -, _ or ., starting and ending with a letter or digit)."),
    spec!("staging_location", py "staging_location", java "stagingLocation", go "staging_location", [], String, Basic, Honoured,
        "Path where the SDK stages the job's files.",
        "The artifacts the SDK stages are written to <location>/<job id>/ (through object_store) and read back from there for SDK workers; default: Weir's staging folder (weir serve --staging_dir). It must be under that folder unless the server runs with --allow_client_staging_locations.", rule "A local path or a file://, gs:// or s3:// URL; a gs:// URL follows Dataflow's rule gs://BUCKET/OBJECT with a valid bucket name (3 or more lowercase letters, digits, -, _ or ., starting and ending with a letter or digit)."),
    spec!("labels", py "labels", java "labels", go "labels", ["label"], Object, Basic, Validated,
        "User labels of the job: lowercase key=value pairs.",
        "Recorded with the job (`Job::validated.labels`) and listed in its messages.", rule "Dataflow's label rules: at most 64 labels; keys `[\\p{Ll}\\p{Lo}][\\p{Ll}\\p{Lo}\\p{N}_-]{0,62}`, values `[\\p{Ll}\\p{Lo}\\p{N}_-]{0,63}`. Accepted as an object, a JSON object string (Java, Go) or Python's repeated key=value (or JSON) list."),
    spec!("experiments", py "experiments", java "experiments", go "experiments", ["experiment"], Array, Basic, Honoured,
        "Experimental features to enable.",
        "no_use_multiple_sdk_containers runs one SDK harness per worker for every SDK (instead of one per core for an SDK that runs bundles on one core, such as Python, whose one harness then runs two bundles per core); weir_test_element_processing_timeout_seconds=N (tests only) sets the element processing timeout to N seconds; the rest reach SDK harnesses.", rule "disable_runner_v2, disable_portable_runner, enable_streaming_java_runner (and Go's disable_runner_v2_until_2023, disable_prime_runner_v2) are rejected: Weir is a Portable Runner (Runner v2). The deprecated experiment worker_region is rejected with worker_region or worker_zone."),
    spec!("dataflow_service_options", py "dataflow_service_options", java "dataflowServiceOptions", go "dataflow_service_options", ["dataflow_service_option"], Array, Basic, Recorded,
        "Options of the Dataflow service (enable_prime, min_num_workers=N, ...).",
        "are Dataflow service settings with no local meaning yet (each entry is listed in the note); recorded"),
    spec!("streaming", py "streaming", java "streaming", go "", [], Boolean, Basic, Honoured,
        "Run the pipeline in streaming mode.",
        "Runs the job in streaming mode, as Dataflow does: triggers run per key and window as elements come, processing-time timers and triggers fire on the wall clock, SDK harnesses of multi-core SDKs run more bundles at a time, and a failing bundle is retried until the job is cancelled or drained (in batch the job fails after 4 attempts). A pipeline with a TestStream or an unbounded PCollection runs in streaming mode without it."),
    spec!("runner", py "runner", java "runner", go "runner", [], String, Basic, Sdk,
        "The runner to use.",
        "Chosen by the client (PortableRunner / universal); Weir receives the job already."),
    spec!("sdk_location", py "sdk_location", java "", go "", [], String, Basic, Sdk,
        "Where the Python SDK package comes from.",
        "The SDK stages the package as an artifact; Weir serves it to SDK workers."),
    spec!("save_main_session", py "save_main_session", java "", go "", [], Boolean, Basic, Sdk,
        "Pickle the main session's state for the workers.",
        "The SDK stages the pickled session; its harness loads it."),
    spec!("pickle_library", py "pickle_library", java "", go "", [], String, Basic, Sdk,
        "Pickler of the Python SDK.",
        "Used by the SDK and its harness."),
    spec!("setup_file", py "setup_file", java "", go "", [], String, Basic, Honoured,
        "setup.py of a package to install on the workers.",
        INSTALLED_BY_WEIR_BOOT),
    spec!("requirements_file", py "requirements_file", java "", go "", [], String, Basic, Honoured,
        "requirements.txt to install on the workers.",
        INSTALLED_BY_WEIR_BOOT),
    spec!("extra_packages", py "extra_packages", java "", go "", ["extra_package"], Array, Basic, Honoured,
        "Extra packages to install on the workers.",
        INSTALLED_BY_WEIR_BOOT),
    spec!("files_to_stage", py "files_to_stage", java "filesToStage", go "", ["file_to_stage"], Array, WorkerLevel, Sdk,
        "Files to make available to each worker.",
        "The SDK stages them; Weir serves them to SDK workers."),
    spec!("dataflow_endpoint", py "dataflow_endpoint", java "dataflowEndpoint", go "dataflow_endpoint", [], String, Basic, Recorded,
        "URL of the Dataflow API.",
        "has no local meaning (Weir is the job service); recorded"),
    spec!("template_location", py "template_location", java "templateLocation", go "template_location", [], String, Basic, Recorded,
        "Save the job as a template there instead of running it.",
        "is not supported: Weir runs the job instead of saving a template; recorded"),
    // ------------------------------------------------------------ resource utilization
    spec!("num_workers", py "num_workers", java "numWorkers", go "num_workers", [], Integer, ResourceUtilization, Honoured,
        "Initial number of worker VMs.",
        "Sets the job's SDK harness count per environment: num_workers × the SDK harnesses of one worker (one for an SDK that declares beam:protocol:multi_core_bundle_processing:v1, such as Java and Go, as Dataflow runs one SDK container of it per VM; else one per core, or one with the experiment no_use_multiple_sdk_containers or when the client's own worker pool runs them as threads of its one interpreter, Python's LOOPBACK); default 1 worker. With THROUGHPUT_BASED autoscaling it is the lower bound. The count is in the job's messages (`starting N SDK harness(es) per environment (W worker(s) of P SDK harness(es) each) ...`).", rule "An integer, 0 or more; 0 means not set, as on Dataflow (Java's numWorkers is 0 when unset)."),
    spec!("max_num_workers", py "max_num_workers", java "maxNumWorkers", go "max_num_workers", [], Integer, ResourceUtilization, Honoured,
        "Maximum number of worker VMs.",
        "With autoscaling_algorithm=THROUGHPUT_BASED: the upper bound, max_num_workers × the SDK harnesses of one worker (default: num_workers, so no room to grow). Without it, no effect (a note says so).", rule "An integer, 0 or more, at least num_workers; 0 means not set, as on Dataflow."),
    spec!("autoscaling_algorithm", py "autoscaling_algorithm", java "autoscalingAlgorithm", go "autoscaling_algorithm", [], String, ResourceUtilization, Honoured,
        "Autoscaling mode: THROUGHPUT_BASED or NONE.",
        "THROUGHPUT_BASED: every second Weir looks at the backlog (bundles waiting for a free SDK harness) of each environment and starts enough SDK harnesses for it, up to max_num_workers × per-worker harnesses; a harness idle for 5 s is stopped while there are more than num_workers × per-worker. Each change is a job message (`autoscaling (THROUGHPUT_BASED): ... scaling from A to B SDK harness(es)`). NONE, and no value: a fixed count (num_workers × per-worker).", rule "THROUGHPUT_BASED or NONE."),
    spec!("flexrs_goal", py "flexrs_goal", java "flexRSGoal", go "flexrs_goal", [], String, ResourceUtilization, Recorded,
        "Flexible Resource Scheduling goal: COST_OPTIMIZED or SPEED_OPTIMIZED.",
        "has no local meaning (no Flexible Resource Scheduling); recorded", rule "COST_OPTIMIZED, SPEED_OPTIMIZED or UNSPECIFIED (also with Go's FLEXRS_ prefix)."),
    spec!("number_of_worker_harness_threads", py "number_of_worker_harness_threads", java "numberOfWorkerHarnessThreads", go "number_of_worker_harness_threads", [], Integer, ResourceUtilization, Honoured,
        "Threads per worker harness.",
        "The number of bundles Weir sends one SDK harness at a time, for every SDK. Unset, the SDK and the job's mode decide: for an SDK whose environment declares the capability beam:protocol:multi_core_bundle_processing:v1 (Java and Go, whose harnesses run bundles on many threads; Weir, like Dataflow, runs one such harness per worker), one per core in a batch job (Dataflow's default for batch; more only contend for the cores) and 16, or two per core when that is more, in a streaming job (`--streaming`, a TestStream or an unbounded PCollection); for the others (Python, whose harness runs bundles on a thread pool under one interpreter lock, about one core per harness: a second bundle runs while the first waits on sleeps, I/O or the runner; with one PROCESS harness per core on Linux, a second bundle of a batch splittable stage without side inputs or state only while the harness's sampled CPU demand (use plus time waiting for a core) shows the first leaving its core partly idle) 2 for each core the harness stands for: 2 with one harness per core, twice the cores with one harness per worker (no_use_multiple_sdk_containers, LOOPBACK). The value is in the job's messages (`each SDK harness runs up to N bundle(s) at a time`, with the reason).", rule "An integer, 0 or more; 0 (Dataflow's default) leaves the choice to Weir."),
    spec!("max_cache_memory_usage_mb", py "max_cache_memory_usage_mb", java "maxCacheMemoryUsageMb", go "", [], Integer, ResourceUtilization, Sdk,
        "Size of the SDK harness's state and side-input cache, in MB (0 disables it).",
        "The SDK harness sizes its cache from it.", rule "An integer, 0 or more."),
    // ------------------------------------------------------------ debugging
    spec!("enable_hot_key_logging", py "enable_hot_key_logging", java "hotKeyLoggingEnabled", go "enable_hot_key_logging", [], Boolean, Debugging, Honoured,
        "Log the literal value of hot keys.",
        "A batch GroupByKey warns in the job's messages when one key holds at least half of the values a worker grouped (at least 1000 values, among at least 8 keys); with this option the warning shows the key (its encoded bytes), without it the key is left out."),
    spec!("element_processing_timeout_minutes", py "element_processing_timeout_minutes", java "elementProcessingTimeoutMinutes", go "", [], Integer, Debugging, Honoured,
        "Time limit for processing one element, in minutes; then the worker restarts.",
        "Weir asks each running bundle for its progress (`ProcessBundleProgress`) every quarter of the timeout (between 0.1 s and 10 s). Progress is the SDK's element counts per PCollection, sampled byte sizes, SDF work completed and the output bytes Weir received; processing times are not progress. When none of them has moved for the timeout, one element is taken to be stuck: Weir restarts that SDK harness (`SDK harness X was stuck: an element of transform T made no progress for 3m (element processing timeout 3m); restarting it`, then `... restarted as Y`) and retries the bundle. A batch job fails after 4 attempts with an error naming the stage and the transform; a streaming job retries without a cap.", rule "An integer of at least 1 (minute)."),
    spec!("element_processing_timeout", py "", java "", go "element_processing_timeout", [], String, Debugging, Honoured,
        "Time limit for processing one element, as a Go duration such as 3m30s.",
        "As element_processing_timeout_minutes.", rule "A Go duration (such as 3m30s) of at least 1m; if element_processing_timeout_minutes is given too, both must agree."),
    spec!("dump_heap_on_oom", py "", java "dumpHeapOnOOM", go "", [], Boolean, Debugging, Recorded,
        "Dump the Java heap when a worker runs out of memory.",
        "has no local meaning yet; recorded"),
    spec!("save_heap_dumps_to_gcs_path", py "", java "saveHeapDumpsToGcsPath", go "", [], String, Debugging, Recorded,
        "Cloud Storage path for heap dumps.",
        "has no local meaning yet; recorded"),
    spec!("save_profiles_to_gcs", py "", java "saveProfilesToGcs", go "", [], String, Debugging, Recorded,
        "Cloud Storage path for worker profiles (Java).",
        "has no local meaning yet; recorded"),
    spec!("profiling_agent_configuration", py "", java "profilingAgentConfiguration", go "", [], Object, Debugging, Recorded,
        "Configuration of Dataflow's profiling agent (Java).",
        "has no local meaning yet; recorded"),
    spec!("profile_cpu", py "profile_cpu", java "", go "", [], Boolean, Debugging, Sdk,
        "Profile the CPU use of each bundle (Python).",
        "The Python SDK harness profiles its bundles."),
    spec!("profile_memory", py "profile_memory", java "", go "", [], Boolean, Debugging, Sdk,
        "Profile the memory use of each bundle (Python).",
        "The Python SDK harness profiles its bundles."),
    spec!("profile_location", py "profile_location", java "", go "", [], String, Debugging, Sdk,
        "Where profiles are written (Python).",
        "The Python SDK harness writes its profiles there."),
    spec!("profile_sample_rate", py "profile_sample_rate", java "", go "", [], Number, Debugging, Sdk,
        "Fraction of bundles profiled (Python).",
        "Used by the Python SDK harness."),
    spec!("cpu_profiling", py "", java "", go "cpu_profiling", [], String, Debugging, Sdk,
        "Where the Go SDK writes CPU profiles.",
        "Used by the Go SDK harness."),
    spec!("default_sdk_harness_log_level", py "default_sdk_harness_log_level", java "defaultSdkHarnessLogLevel", go "", [], String, Debugging, Sdk,
        "Default log level of SDK harnesses.",
        "Applied by the SDK harness; its logs reach Weir's log through the Logging service."),
    spec!("sdk_harness_log_level_overrides", py "sdk_harness_log_level_overrides", java "sdkHarnessLogLevelOverrides", go "", [], Object, Debugging, Sdk,
        "Log levels of named loggers in SDK harnesses.",
        "Applied by the SDK harness."),
    spec!("default_worker_log_level", py "", java "defaultWorkerLogLevel", go "", [], String, Debugging, Recorded,
        "Default log level of the legacy Dataflow Java worker.",
        "has no local meaning (no legacy worker; use default_sdk_harness_log_level); recorded"),
    spec!("worker_log_level_overrides", py "", java "workerLogLevelOverrides", go "", [], Object, Debugging, Recorded,
        "Log levels of the legacy Dataflow Java worker.",
        "has no local meaning (no legacy worker; use sdk_harness_log_level_overrides); recorded"),
    spec!("dataflow_job_file", py "dataflow_job_file", java "", go "", [], String, Debugging, Recorded,
        "Write the Dataflow job specification to this file.",
        "has no local meaning (there is no Dataflow job specification); recorded"),
    // ------------------------------------------------------------ security and networking
    spec!("service_account_email", py "service_account_email", java "serviceAccount", go "service_account_email", [], String, SecurityAndNetworking, Recorded,
        "Service account the worker VMs run as.",
        "has no local meaning yet (SDK workers run as Weir's user); recorded"),
    spec!("impersonate_service_account", py "impersonate_service_account", java "impersonateServiceAccount", go "", [], String, SecurityAndNetworking, Sdk,
        "Service account (or delegation chain) to impersonate for API calls.",
        "Passed to SDK harnesses, whose Google Cloud clients use it."),
    spec!("gcp_oauth_scopes", py "gcp_oauth_scopes", java "gcpOauthScopes", go "", ["gcp_oauth_scope"], Array, SecurityAndNetworking, Sdk,
        "OAuth scopes of Google Cloud credentials.",
        "Passed to SDK harnesses, whose Google Cloud clients request them."),
    spec!("dataflow_kms_key", py "dataflow_kms_key", java "dataflowKmsKey", go "dataflow_kms_key", [], String, SecurityAndNetworking, Recorded,
        "Cloud KMS key that encrypts the job's state and shuffle data.",
        "has no local meaning yet (Weir keeps shuffle and state in memory, unencrypted); recorded"),
    spec!("network", py "network", java "network", go "network", [], String, SecurityAndNetworking, Recorded,
        "VPC network of the worker VMs.",
        "has no local meaning (no worker VMs); recorded"),
    spec!("subnetwork", py "subnetwork", java "subnetwork", go "subnetwork", [], String, SecurityAndNetworking, Recorded,
        "Subnetwork of the worker VMs.",
        "has no local meaning (no worker VMs); recorded"),
    spec!("use_public_ips", py "use_public_ips", java "usePublicIps", go "use_public_ips", [], Boolean, SecurityAndNetworking, Recorded,
        "Whether worker VMs get public IP addresses.",
        "has no local meaning (no worker VMs); recorded", rule "Not true together with no_use_public_ips=true."),
    spec!("no_use_public_ips", py "no_use_public_ips", java "", go "no_use_public_ips", [], Boolean, SecurityAndNetworking, Recorded,
        "Worker VMs get private IP addresses only.",
        "has no local meaning (no worker VMs); recorded", rule "Not true together with use_public_ips=true."),
    // ------------------------------------------------------------ streaming pipeline management
    spec!("enable_streaming_engine", py "enable_streaming_engine", java "enableStreamingEngine", go "", [], Boolean, StreamingPipelineManagement, Recorded,
        "Run streaming state and shuffle in Dataflow's Streaming Engine.",
        "has no local meaning (Weir keeps state itself); recorded (noted only for streaming jobs, as Python always sends true)"),
    spec!("update", py "update", java "update", go "update", [], Boolean, StreamingPipelineManagement, Recorded,
        "Replace the running job of the same name.",
        "has no local meaning yet: Weir starts a new job and cannot replace a running one; recorded"),
    spec!("transform_name_mapping", py "transform_name_mapping", java "transformNameMapping", go "transform_name_mapping", [], Object, StreamingPipelineManagement, Recorded,
        "Old-to-new transform names for --update.",
        "has no local meaning yet (Weir cannot update jobs); recorded", rule "An object of strings, or its JSON."),
    spec!("create_from_snapshot", py "create_from_snapshot", java "createFromSnapshot", go "", [], String, StreamingPipelineManagement, Recorded,
        "Start the job from this Dataflow snapshot.",
        "has no local meaning (Weir has no snapshots); recorded"),
    // ------------------------------------------------------------ worker-level
    spec!("worker_machine_type", py "machine_type", java "workerMachineType", go "worker_machine_type", ["machine_type"], String, WorkerLevel, Recorded,
        "Compute Engine machine type of the workers.",
        "has no local meaning (no worker VMs); recorded"),
    spec!("disk_size_gb", py "disk_size_gb", java "diskSizeGb", go "disk_size_gb", [], Integer, WorkerLevel, Recorded,
        "Boot disk size of each worker, in GB (0: service default).",
        "has no local meaning (no worker VMs); recorded", rule "An integer, 0 or more."),
    spec!("worker_disk_type", py "disk_type", java "workerDiskType", go "disk_type", ["disk_type"], String, WorkerLevel, Recorded,
        "Persistent disk type of the workers.",
        "has no local meaning (no worker VMs); recorded"),
    spec!("disk_provisioned_iops", py "disk_provisioned_iops", java "", go "", [], Integer, WorkerLevel, Recorded,
        "Provisioned IOPS of the worker disks.",
        "has no local meaning (no worker VMs); recorded", rule "A positive integer."),
    spec!("disk_provisioned_throughput_mibps", py "disk_provisioned_throughput_mibps", java "", go "", [], Integer, WorkerLevel, Recorded,
        "Provisioned throughput of the worker disks, in MiB/s.",
        "has no local meaning (no worker VMs); recorded", rule "A positive integer."),
    spec!("worker_region", py "worker_region", java "workerRegion", go "worker_region", [], String, WorkerLevel, Recorded,
        "Region of the worker VMs.",
        "has no local meaning (jobs run on this machine); recorded", rule "Not with zone or worker_zone."),
    spec!("worker_zone", py "worker_zone", java "workerZone", go "worker_zone", [], String, WorkerLevel, Recorded,
        "Zone of the worker VMs.",
        "has no local meaning (jobs run on this machine); recorded", rule "Not with zone or worker_region."),
    spec!("zone", py "zone", java "zone", go "zone", [], String, WorkerLevel, Recorded,
        "Zone of the worker VMs (deprecated: use worker_zone).",
        "has no local meaning (jobs run on this machine); recorded", rule "Not with worker_region or worker_zone."),
    spec!("min_cpu_platform", py "min_cpu_platform", java "minCpuPlatform", go "min_cpu_platform", [], String, WorkerLevel, Recorded,
        "Minimum CPU platform of the worker VMs.",
        "has no local meaning (no worker VMs); recorded"),
    spec!("sdk_container_image", py "sdk_container_image", java "sdkContainerImage", go "sdk_container_image", [], String, WorkerLevel, Sdk,
        "Container image of the SDK harness.",
        "The SDK writes it into the pipeline's Docker environments (Java's does; Beam Python's PortableRunner takes the image from --environment_config instead, and a job whose environments do not use the image gets a warning saying so): `docker run` where a Docker daemon answers; without one, Beam's SDK images are replaced by native `weir boot` harnesses and other images fail Prepare (README, Environments)."),
    spec!("worker_harness_container_image", py "worker_harness_container_image", java "workerHarnessContainerImage", go "worker_harness_container_image", [], String, WorkerLevel, Sdk,
        "Deprecated name of sdk_container_image.",
        "As sdk_container_image."),
    spec!("sdk_harness_container_image_overrides", py "sdk_harness_container_image_overrides", java "sdkHarnessContainerImageOverrides", go "sdk_harness_container_image_override", [], Array, WorkerLevel, Recorded,
        "Replace container images of environments (regex,image pairs).",
        "is not applied by Weir yet (environments run with the images the pipeline names); recorded"),
    spec!("dataflow_worker_jar", py "", java "dataflowWorkerJar", go "dataflow_worker_jar", [], String, WorkerLevel, Recorded,
        "Custom Dataflow worker jar.",
        "has no local meaning (there is no Dataflow worker); recorded"),
    spec!("worker_binary", py "", java "", go "worker_binary", [], String, WorkerLevel, Sdk,
        "Go worker binary to run on the workers.",
        "The Go SDK stages the binary; Weir serves it to the Go SDK container."),
];
