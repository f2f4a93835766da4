//! `BeamFnLogging` (beam_fn_api.proto): SDK log entries go to Weir's log and,
//! through the job's SDK log sink ([`FnApi::set_sdk_log`]), to the job's logs
//! (which keep the last entries of each job; `weir jobs logs` reads them).
//! Every severity is forwarded: DEBUG entries arrive only when the pipeline
//! asks for them (`--default_sdk_harness_log_level=DEBUG`). Which of them the
//! job's message stream carries is the job's choice (warnings and errors
//! only; see `weir_jobs::registry::Job::sdk_log`). The text is `[<worker
//! id>] <message>`, plus ` (<transform id>)` when the SDK names the
//! transform, plus the traceback. Weir's own log takes each harness's
//! entries at a bounded rate ([`SERVER_LOG_PER_SECOND`]).

use std::sync::Arc;

use futures::StreamExt;
use weir_proto::beam;

use super::known_worker;
use crate::registry::{FnApi, WorkerLog};

/// SDK log entries of one harness that Weir's own log takes in a burst.
pub const SERVER_LOG_BURST: f64 = 1000.0;
/// SDK log entries of one harness that Weir's own log takes per second
/// after a burst; the rest reach the job's logs only, so that one chatty
/// DoFn cannot fill the operator's disk.
pub const SERVER_LOG_PER_SECOND: f64 = 100.0;

/// How often Weir's own log says how many entries of a harness it left out.
const SUMMARY_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// The logging service.
pub struct LoggingService(pub Arc<FnApi>);

#[tonic::async_trait]
impl beam::beam_fn_logging_server::BeamFnLogging for LoggingService {
    /// Sends nothing, and ends when the SDK ends its side: Java's harness
    /// waits for that (up to 10 s) before it gives the process its logging
    /// configuration back.
    type LoggingStream = std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<beam::LogControl, tonic::Status>> + Send>,
    >;

    async fn logging(
        &self,
        request: tonic::Request<tonic::Streaming<beam::log_entry::List>>,
    ) -> Result<tonic::Response<Self::LoggingStream>, tonic::Status> {
        let worker = known_worker(&self.0, &request)?;
        worker.logging.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut inbound = request.into_inner();
        let fn_api = self.0.clone();
        let (ended, on_end) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ended = ended;
            // Weir's own log: a token bucket per harness (see SERVER_LOG_BURST).
            let mut allowance = SERVER_LOG_BURST;
            let mut refilled = std::time::Instant::now();
            let mut held_back = 0u64;
            let mut last_summary = std::time::Instant::now();
            while let Some(Ok(list)) = inbound.next().await {
                for e in list.log_entries {
                    // Severity enum of LogEntry: TRACE=1 DEBUG=2 INFO=3 NOTICE=4 WARN=5 ERROR=6 CRITICAL=7.
                    let level = match e.severity {
                        0..=2 => WorkerLog::Debug,
                        3 | 4 => WorkerLog::Info,
                        5 => WorkerLog::Warning,
                        _ => WorkerLog::Error,
                    };
                    let mut text = e.message.clone();
                    if !e.transform_id.is_empty() {
                        text.push_str(&format!(" ({})", e.transform_id));
                    }
                    if !e.trace.is_empty() {
                        text.push('\n');
                        text.push_str(&e.trace);
                    }
                    let now = std::time::Instant::now();
                    allowance = (allowance
                        + now.duration_since(refilled).as_secs_f64() * SERVER_LOG_PER_SECOND)
                        .min(SERVER_LOG_BURST);
                    refilled = now;
                    if held_back > 0 && now.duration_since(last_summary) >= SUMMARY_EVERY {
                        tracing::warn!(worker = %worker.id, "{held_back} SDK log entries kept off this log (over {SERVER_LOG_PER_SECOND} a second); `weir jobs logs` shows the job's most recent entries");
                        held_back = 0;
                        last_summary = now;
                    }
                    // An echo of the job's own messages goes to the job's
                    // log as any entry, and to Weir's at DEBUG only.
                    let echo = match fn_api.sdk_log(&worker.job_id) {
                        Some(sink) => sink(level, format!("[{}] {text}", worker.id)),
                        None => false,
                    };
                    if echo {
                        tracing::debug!(worker = %worker.id, "{text}");
                    } else if allowance >= 1.0 {
                        allowance -= 1.0;
                        match level {
                            WorkerLog::Error => tracing::error!(worker = %worker.id, "{text}"),
                            WorkerLog::Warning => tracing::warn!(worker = %worker.id, "{text}"),
                            WorkerLog::Info => tracing::info!(worker = %worker.id, "{text}"),
                            WorkerLog::Debug => tracing::debug!(worker = %worker.id, "{text}"),
                        }
                    } else {
                        held_back += 1;
                    }
                }
            }
            if held_back > 0 {
                tracing::warn!(worker = %worker.id, "{held_back} SDK log entries kept off this log (over {SERVER_LOG_PER_SECOND} a second); `weir jobs logs` shows the job's most recent entries");
            }
        });
        let reply = futures::stream::once(on_end).filter_map(|_| async { None });
        Ok(tonic::Response::new(Box::pin(reply)))
    }
}
