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
    /// SDK harnesses did not connect in time.
    #[error("SDK harness {worker_id} did not connect within {seconds} s")]
    ConnectTimeout { worker_id: String, seconds: u64 },
    /// A Weir bug.
    #[error("internal error in Weir's harness (this is a Weir bug): {0}")]
    Internal(String),
}

/// Result alias of the harness.
pub type Result<T> = std::result::Result<T, HarnessError>;
