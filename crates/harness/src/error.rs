//! Harness errors.

/// A failure starting or talking to SDK harnesses.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The environment could not start an SDK harness (bad payload, command not found, pool refused).
    #[error("environment {environment} ({urn}): {message}")]
    Environment {
        environment: String,
        urn: String,
        message: String,
    },
    /// SDK harnesses did not connect in time: within `seconds` of their
    /// start (a worker pool's) or of their process's last output line.
    #[error("SDK harness {worker_id} did not connect {why}")]
    ConnectTimeout {
        worker_id: String,
        /// E.g. "within 120 s".
        why: String,
    },
    /// An SDK harness process ended before it dialed the control service.
    #[error("SDK harness {worker_id} exited before it connected (exit status {status}){}", stderr_tail(.stderr))]
    ExitedBeforeConnect {
        worker_id: String,
        /// The exit code, or how the process ended (e.g. a signal).
        status: String,
        /// The last lines the process wrote (stdout and stderr), oldest first.
        stderr: Vec<String>,
    },
    /// The job was cancelled while its SDK harnesses started.
    #[error("the job was cancelled while its SDK harnesses started")]
    Cancelled,
    /// The job's SDK harnesses were stopped ([`crate::environment::SdkHarnesses::stop`])
    /// before this one connected.
    #[error("SDK harness {worker_id} was stopped before it connected")]
    Stopped { worker_id: String },
    /// A Weir bug.
    #[error("internal error in Weir's harness (this is a Weir bug): {0}")]
    Internal(String),
}

/// Result alias of the harness.
pub type Result<T> = std::result::Result<T, HarnessError>;

fn stderr_tail(lines: &[String]) -> String {
    if lines.is_empty() {
        " and wrote nothing".to_string()
    } else {
        format!("; its last output:\n{}", lines.join("\n"))
    }
}
