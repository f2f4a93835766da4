//! `weir boot`: a boot command for `beam:env:process:v1` Python SDK harnesses
//! without Docker or Beam's Go boot binary.
//!
//! Follows Beam's container contract: called as `<command> --id=<worker id>
//! --provision_endpoint=<host:port>`, it fetches the provision info, stages
//! the job's artifacts into `<semi-persistent dir>/staged/`, then replaces
//! itself with `python -m apache_beam.runners.worker.sdk_worker_main`, setting
//! the environment that module reads (`WORKER_ID`, `PIPELINE_OPTIONS`,
//! `CONTROL_API_SERVICE_DESCRIPTOR`, `LOGGING_API_SERVICE_DESCRIPTOR`,
//! `SEMI_PERSISTENT_DIRECTORY`, `RUNNER_CAPABILITIES`).

use std::path::PathBuf;

use futures::StreamExt;
use prost::Message;
use tonic::metadata::MetadataValue;
use weir_proto::{beam, prost_types, urns, MAX_GRPC_MESSAGE_BYTES};

/// What `weir boot` was told.
#[derive(Clone, Debug)]
pub struct BootConfig {
    pub worker_id: String,
    pub provision_endpoint: String,
    /// Python interpreter with apache-beam installed.
    pub python: String,
    /// Where artifacts and the pickled main session go (default: a temp dir per worker).
    pub semi_persistent_directory: Option<PathBuf>,
}

/// Converts a protobuf `Struct` (pipeline options) to JSON.
pub fn struct_to_json(s: &prost_types::Struct) -> serde_json::Value {
    serde_json::Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect(),
    )
}

fn value_to_json(v: &prost_types::Value) -> serde_json::Value {
    use prost_types::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n)
            .map(serde_json::Value::Number)
            .unwrap_or(serde_json::Value::Null),
        Some(Kind::StringValue(s)) => serde_json::Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => serde_json::Value::Bool(*b),
        Some(Kind::StructValue(s)) => struct_to_json(s),
        Some(Kind::ListValue(l)) => {
            serde_json::Value::Array(l.values.iter().map(value_to_json).collect())
        }
    }
}

fn with_worker<T>(msg: T, worker_id: &str) -> Result<tonic::Request<T>, String> {
    let mut req = tonic::Request::new(msg);
    let v = MetadataValue::try_from(worker_id).map_err(|e| format!("bad worker id: {e}"))?;
    req.metadata_mut().insert("worker_id", v);
    Ok(req)
}

/// Fetches provision info and artifacts, then execs the Python SDK harness.
/// Returns only on failure.
pub async fn boot(cfg: BootConfig) -> Result<std::convert::Infallible, String> {
    let mut provision = beam::provision_service_client::ProvisionServiceClient::connect(
        weir_proto::grpc_uri(&cfg.provision_endpoint),
    )
    .await
    .map_err(|e| {
        format!(
            "cannot reach provision endpoint {}: {e}",
            cfg.provision_endpoint
        )
    })?
    .max_decoding_message_size(MAX_GRPC_MESSAGE_BYTES);
    let info = provision
        .get_provision_info(with_worker(
            beam::GetProvisionInfoRequest {},
            &cfg.worker_id,
        )?)
        .await
        .map_err(|e| format!("GetProvisionInfo failed: {e}"))?
        .into_inner()
        .info
        .ok_or("provision response has no info")?;

    let semi = cfg
        .semi_persistent_directory
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("weir-{}", cfg.worker_id)));
    let staged = semi.join("staged");
    std::fs::create_dir_all(&staged)
        .map_err(|e| format!("cannot create {}: {e}", staged.display()))?;

    if !info.dependencies.is_empty() {
        let endpoint = info
            .artifact_endpoint
            .as_ref()
            .map(|d| d.url.clone())
            .unwrap_or_else(|| cfg.provision_endpoint.clone());
        let mut artifacts =
            beam::artifact_retrieval_service_client::ArtifactRetrievalServiceClient::connect(
                weir_proto::grpc_uri(&endpoint),
            )
            .await
            .map_err(|e| format!("cannot reach artifact endpoint {endpoint}: {e}"))?
            .max_decoding_message_size(MAX_GRPC_MESSAGE_BYTES);
        for (i, dep) in info.dependencies.iter().enumerate() {
            let name = if dep.role_urn == urns::artifact::ROLE_STAGING_TO {
                beam::ArtifactStagingToRolePayload::decode(dep.role_payload.as_slice())
                    .map(|p| p.staged_name)
                    .unwrap_or_default()
            } else {
                String::new()
            };
            let name = if name.is_empty() || name.contains('/') {
                format!("artifact-{i}")
            } else {
                name
            };
            let mut stream = artifacts
                .get_artifact(with_worker(
                    beam::GetArtifactRequest {
                        artifact: Some(dep.clone()),
                    },
                    &cfg.worker_id,
                )?)
                .await
                .map_err(|e| format!("GetArtifact {name} failed: {e}"))?
                .into_inner();
            let mut bytes = Vec::new();
            while let Some(chunk) = stream.next().await {
                bytes.extend(
                    chunk
                        .map_err(|e| format!("GetArtifact {name} failed: {e}"))?
                        .data,
                );
            }
            std::fs::write(staged.join(&name), bytes)
                .map_err(|e| format!("cannot write artifact {name}: {e}"))?;
        }
    }

    let options = info
        .pipeline_options
        .as_ref()
        .map(struct_to_json)
        .unwrap_or(serde_json::json!({}));
    let descriptor = |d: &Option<beam::ApiServiceDescriptor>| {
        format!(
            "url: \"{}\"",
            d.as_ref()
                .map(|d| d.url.as_str())
                .unwrap_or(cfg.provision_endpoint.as_str())
        )
    };
    let mut cmd = std::process::Command::new(&cfg.python);
    cmd.args(["-m", "apache_beam.runners.worker.sdk_worker_main"])
        .env("WORKER_ID", &cfg.worker_id)
        .env("PIPELINE_OPTIONS", options.to_string())
        .env("SEMI_PERSISTENT_DIRECTORY", &semi)
        .env(
            "CONTROL_API_SERVICE_DESCRIPTOR",
            descriptor(&info.control_endpoint),
        )
        .env(
            "LOGGING_API_SERVICE_DESCRIPTOR",
            descriptor(&info.logging_endpoint),
        )
        .env("RUNNER_CAPABILITIES", info.runner_capabilities.join(" "));
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let err = cmd.exec();
        Err(format!("cannot exec {}: {err}", cfg.python))
    }
    #[cfg(not(unix))]
    {
        let status = cmd
            .status()
            .map_err(|e| format!("cannot run {}: {e}", cfg.python))?;
        std::process::exit(status.code().unwrap_or(1));
    }
}
