//! `weir jobs list|describe|cancel`: a small Job API client for a running server.

use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use weir_proto::beam;
use weir_proto::beam::job_service_client::JobServiceClient;
use weir_proto::prost_types::{value::Kind, Value};

use crate::{JobsAction, JobsArgs};

fn state_name(state: i32) -> &'static str {
    beam::job_state::Enum::try_from(state)
        .map(|s| s.as_str_name())
        .unwrap_or("UNKNOWN")
}

fn show(v: &Value) -> String {
    match &v.kind {
        Some(Kind::StringValue(s)) => s.clone(),
        Some(Kind::NumberValue(n)) => n.to_string(),
        Some(Kind::BoolValue(b)) => b.to_string(),
        Some(Kind::ListValue(l)) => format!(
            "[{}]",
            l.values.iter().map(show).collect::<Vec<_>>().join(", ")
        ),
        Some(Kind::StructValue(s)) => {
            format!(
                "{{{}}}",
                s.fields
                    .iter()
                    .map(|(k, v)| format!("{k}: {}", show(v)))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
        Some(Kind::NullValue(_)) | None => "null".into(),
    }
}

/// Runs a `weir jobs` action against `args.endpoint`.
pub(crate) async fn run(args: JobsArgs) -> anyhow::Result<()> {
    let url = weir_proto::grpc_uri(&args.endpoint);
    let mut client = JobServiceClient::connect(url.clone())
        .await
        .with_context(|| format!("cannot reach the Job API at {}", args.endpoint))?
        .max_decoding_message_size(weir_proto::MAX_GRPC_MESSAGE_BYTES);
    match args.action {
        JobsAction::List => {
            let jobs = client
                .get_jobs(beam::GetJobsRequest {})
                .await?
                .into_inner()
                .job_info;
            for j in jobs {
                println!("{}\t{}\t{}", j.job_id, state_name(j.state), j.job_name);
            }
        }
        JobsAction::Describe { job_id } => {
            let jobs = client
                .get_jobs(beam::GetJobsRequest {})
                .await?
                .into_inner()
                .job_info;
            let job = jobs
                .into_iter()
                .find(|j| j.job_id == job_id)
                .with_context(|| format!("no job {job_id:?}"))?;
            println!("id:    {}", job.job_id);
            println!("name:  {}", job.job_name);
            println!("state: {}", state_name(job.state));
            // The state stream replays the job's history first; a running job's
            // stream stays open, so read what arrives promptly.
            let mut states = client
                .get_state_stream(beam::GetJobStateRequest {
                    job_id: job_id.clone(),
                })
                .await?
                .into_inner();
            println!("history:");
            while let Ok(Some(Ok(event))) =
                tokio::time::timeout(Duration::from_millis(300), states.next()).await
            {
                let at = event.timestamp.map(|t| format!("{t}")).unwrap_or_default();
                println!("  {at}  {}", state_name(event.state));
            }
            println!("options:");
            let mut options: Vec<_> = job
                .pipeline_options
                .map(|o| o.fields.into_iter().collect())
                .unwrap_or_default();
            options.sort_by(|a: &(String, Value), b| a.0.cmp(&b.0));
            for (k, v) in options {
                let name = k
                    .strip_prefix("beam:option:")
                    .and_then(|k| k.strip_suffix(":v1"))
                    .unwrap_or(&k)
                    .to_string();
                println!("  {name} = {}", show(&v));
            }
        }
        JobsAction::Cancel { job_id } => {
            let state = client
                .cancel(beam::CancelJobRequest {
                    job_id: job_id.clone(),
                })
                .await?
                .into_inner()
                .state;
            println!("{job_id}\t{}", state_name(state));
        }
    }
    Ok(())
}
