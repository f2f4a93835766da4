//! URN constants: the only place Weir spells Beam's URN strings.
//!
//! prost drops the `beam_urn` enum-value options of Beam's protos, so the
//! strings from `beam_runner_api.proto` / `standard_window_fns.proto` /
//! `beam_fn_api.proto` are written here once.

/// PTransform URNs (`StandardPTransforms` and friends in beam_runner_api.proto).
pub mod transform {
    pub const IMPULSE: &str = "beam:transform:impulse:v1";
    pub const GROUP_BY_KEY: &str = "beam:transform:group_by_key:v1";
    pub const FLATTEN: &str = "beam:transform:flatten:v1";
    pub const PAR_DO: &str = "beam:transform:pardo:v1";
    pub const WINDOW_INTO: &str = "beam:transform:window_into:v1";
    pub const ASSIGN_WINDOWS: &str = "beam:transform:window_into:v1";
    pub const RESHUFFLE: &str = "beam:transform:reshuffle:v1";
    pub const REDISTRIBUTE_ARBITRARILY: &str = "beam:transform:redistribute_arbitrarily:v1";
    pub const REDISTRIBUTE_BY_KEY: &str = "beam:transform:redistribute_by_key:v1";
    pub const TEST_STREAM: &str = "beam:transform:teststream:v1";
    pub const MAP_WINDOWS: &str = "beam:transform:map_windows:v1";
    pub const MERGE_WINDOWS: &str = "beam:transform:merge_windows:v1";
    pub const TO_STRING: &str = "beam:transform:to_string:v1";
    pub const GROUP_INTO_BATCHES_WITH_SHARDED_KEY: &str =
        "beam:transform:group_into_batches_with_sharded_key:v1";

    pub const COMBINE_PER_KEY: &str = "beam:transform:combine_per_key:v1";
    pub const COMBINE_GLOBALLY: &str = "beam:transform:combine_globally:v1";
    pub const COMBINE_GROUPED_VALUES: &str = "beam:transform:combine_grouped_values:v1";
    pub const COMBINE_PER_KEY_PRECOMBINE: &str = "beam:transform:combine_per_key_precombine:v1";
    pub const COMBINE_PER_KEY_MERGE_ACCUMULATORS: &str =
        "beam:transform:combine_per_key_merge_accumulators:v1";
    pub const COMBINE_PER_KEY_EXTRACT_OUTPUTS: &str =
        "beam:transform:combine_per_key_extract_outputs:v1";
    pub const COMBINE_PER_KEY_CONVERT_TO_ACCUMULATORS: &str =
        "beam:transform:combine_per_key_convert_to_accumulators:v1";

    pub const SDF_PAIR_WITH_RESTRICTION: &str = "beam:transform:sdf_pair_with_restriction:v1";
    pub const SDF_SPLIT_AND_SIZE_RESTRICTIONS: &str =
        "beam:transform:sdf_split_and_size_restrictions:v1";
    pub const SDF_PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS: &str =
        "beam:transform:sdf_process_sized_element_and_restrictions:v1";
    pub const SDF_TRUNCATE_SIZED_RESTRICTIONS: &str =
        "beam:transform:sdf_truncate_sized_restrictions:v1";

    /// Composites the runner expands by recursing into their subtransforms.
    pub const GENERIC_COMPOSITE: &str = "beam:transform:generic_composite:v1";
    pub const PICKLED_PYTHON: &str = "beam:transform:pickled_python:v1";
    pub const READ: &str = "beam:transform:read:v1";
    pub const CREATE_VIEW: &str = "beam:transform:create_view:v1";
    pub const WRITE_FILES: &str = "beam:transform:write_files:v1";

    /// Fn API data-plane transforms (beam_fn_api.proto, RemoteGrpcPort).
    pub const DATA_SOURCE: &str = "beam:runner:source:v1";
    pub const DATA_SINK: &str = "beam:runner:sink:v1";
}

/// Coder URNs (`StandardCoders` in beam_runner_api.proto).
pub mod coder {
    pub const BYTES: &str = "beam:coder:bytes:v1";
    pub const STRING_UTF8: &str = "beam:coder:string_utf8:v1";
    pub const KV: &str = "beam:coder:kv:v1";
    pub const BOOL: &str = "beam:coder:bool:v1";
    pub const VARINT: &str = "beam:coder:varint:v1";
    pub const DOUBLE: &str = "beam:coder:double:v1";
    pub const ITERABLE: &str = "beam:coder:iterable:v1";
    pub const TIMER: &str = "beam:coder:timer:v1";
    pub const INTERVAL_WINDOW: &str = "beam:coder:interval_window:v1";
    pub const LENGTH_PREFIX: &str = "beam:coder:length_prefix:v1";
    pub const GLOBAL_WINDOW: &str = "beam:coder:global_window:v1";
    pub const WINDOWED_VALUE: &str = "beam:coder:windowed_value:v1";
    pub const PARAM_WINDOWED_VALUE: &str = "beam:coder:param_windowed_value:v1";
    pub const STATE_BACKED_ITERABLE: &str = "beam:coder:state_backed_iterable:v1";
    pub const CUSTOM_WINDOW: &str = "beam:coder:custom_window:v1";
    pub const ROW: &str = "beam:coder:row:v1";
    pub const SHARDED_KEY: &str = "beam:coder:sharded_key:v1";
    pub const NULLABLE: &str = "beam:coder:nullable:v1";
    /// A Go SDK custom coder (`graphx.urnCustomCoder`); the Go SDK always
    /// writes it inside a `length_prefix` coder, and its element encoders
    /// write the length prefix themselves.
    pub const GO_CUSTOM: &str = "beam:go:coder:custom:v1";
    /// A coder the Java SDK serialized (Beam Java's `CoderTranslation`):
    /// the payload is the coder object, Java-serialized and compressed by
    /// snappy-java.
    pub const JAVA_SDK: &str = "beam:coders:javasdk:0.1";
}

/// WindowFn URNs (standard_window_fns.proto).
pub mod window_fn {
    pub const GLOBAL: &str = "beam:window_fn:global_windows:v1";
    pub const FIXED: &str = "beam:window_fn:fixed_windows:v1";
    pub const SLIDING: &str = "beam:window_fn:sliding_windows:v1";
    pub const SESSIONS: &str = "beam:window_fn:session_windows:v1";
    /// A Python `WindowFn` pickled by the SDK (python_urns.PICKLED_WINDOWFN);
    /// its payload is a `google.protobuf.BytesValue` of the pickle.
    pub const PICKLED_PYTHON: &str = "beam:window_fn:pickled_python:v1";
}

/// Side-input access patterns (`StandardSideInputTypes`).
pub mod side_input {
    pub const ITERABLE: &str = "beam:side_input:iterable:v1";
    pub const MULTIMAP: &str = "beam:side_input:multimap:v1";
}

/// Environment URNs (`StandardEnvironments`).
pub mod env {
    pub const DOCKER: &str = "beam:env:docker:v1";
    pub const PROCESS: &str = "beam:env:process:v1";
    pub const EXTERNAL: &str = "beam:env:external:v1";
    pub const DEFAULT: &str = "beam:env:default:v1";
    /// `AnyOfEnvironmentPayload`: the runner picks one of several environments.
    pub const ANYOF: &str = "beam:env:anyof:v1";
}

/// Pipeline requirement URNs (`StandardRequirements`).
pub mod requirement {
    pub const SPLITTABLE_DOFN: &str = "beam:requirement:pardo:splittable_dofn:v1";
    pub const STATEFUL_PROCESSING: &str = "beam:requirement:pardo:stateful:v1";
    pub const REQUIRES_STABLE_INPUT: &str = "beam:requirement:pardo:stable_input:v1";
    pub const REQUIRES_TIME_SORTED_INPUT: &str = "beam:requirement:pardo:time_sorted_input:v1";
    pub const BUNDLE_FINALIZATION: &str = "beam:requirement:pardo:finalization:v1";
    pub const ON_WINDOW_EXPIRATION: &str = "beam:requirement:pardo:on_window_expiration:v1";
}

/// Artifact type and role URNs (`StandardArtifacts`).
pub mod artifact {
    pub const TYPE_FILE: &str = "beam:artifact:type:file:v1";
    pub const TYPE_URL: &str = "beam:artifact:type:url:v1";
    pub const TYPE_EMBEDDED: &str = "beam:artifact:type:embedded:v1";
    pub const ROLE_STAGING_TO: &str = "beam:artifact:role:staging_to:v1";
    /// A pip requirements file (the Python SDK's PyPI requirements of its
    /// transforms), to be installed with its packages.
    pub const ROLE_PIP_REQUIREMENTS_FILE: &str = "beam:artifact:role:pip_requirements_file:v1";
    /// The Go SDK's worker binary (payload: `ArtifactStagingToRolePayload`).
    pub const ROLE_GO_WORKER_BINARY: &str = "beam:artifact:role:go_worker_binary:v1";
}

/// MonitoringInfo URNs and payload types the runner reads (metrics.proto).
pub mod monitoring {
    pub const ELEMENT_COUNT: &str = "beam:metric:element_count:v1";
    pub const USER_SUM_INT64: &str = "beam:metric:user:sum_int64:v1";
    pub const TYPE_SUM_INT64: &str = "beam:metrics:sum_int64:v1";
    pub const TYPE_DISTRIBUTION_INT64: &str = "beam:metrics:distribution_int64:v1";
    pub const TYPE_LATEST_INT64: &str = "beam:metrics:latest_int64:v1";
    pub const TYPE_SET_STRING: &str = "beam:metrics:set_string:v1";
    /// The label key naming a MonitoringInfo's transform
    /// (`MonitoringInfo.MonitoringInfoLabels.TRANSFORM`).
    pub const PTRANSFORM_LABEL: &str = "PTRANSFORM";
}

/// Runner capabilities Weir announces to SDK harnesses (provision info).
pub mod capability {
    pub const MONITORING_INFO_SHORT_IDS: &str = "beam:protocol:monitoring_info_short_ids:v1";
    pub const CONTROL_RESPONSE_ELEMENTS_EMBEDDING: &str =
        "beam:protocol:control_response_elements_embedding:v1";
}

/// SDK capabilities an environment declares (`StandardProtocols`,
/// `Environment.capabilities`).
pub mod protocol {
    /// The SDK harness runs several bundles at once on many cores (Java,
    /// Go); Dataflow gives an SDK without it one harness per core.
    pub const MULTI_CORE_BUNDLE_PROCESSING: &str = "beam:protocol:multi_core_bundle_processing:v1";
}

/// User-state protocol URNs (`StandardUserStateTypes`, the `protocol` of a
/// `StateSpec`): which `StateKey` kinds the SDK uses for the state.
pub mod user_state {
    /// `StateKey.BagUserState` (Python's value, bag, combining and set state).
    pub const BAG: &str = "beam:user_state:bag:v1";
    /// `StateKey.MultimapUserState` and `StateKey.MultimapKeysUserState`
    /// (Java's MapState and MultimapState).
    pub const MULTIMAP: &str = "beam:user_state:multimap:v1";
    /// `StateKey.OrderedListUserState`.
    pub const ORDERED_LIST: &str = "beam:user_state:ordered_list:v1";
}
