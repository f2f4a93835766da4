//! Engine errors, classified by whose fault they are.

/// Why a job stopped.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    /// A bundle failed in the SDK harness (user code raised, or the harness died).
    #[error("stage {stage} failed: {message}")]
    BundleFailed { stage: String, message: String },
    /// The runner could not decode data an SDK sent for a PCollection.
    #[error("stage {stage}: bad data for PCollection {pcollection}: {message}")]
    BadData {
        stage: String,
        pcollection: String,
        message: String,
    },
    /// A GroupByKey could not spill to (or read back from) local disk.
    #[error("stage {stage}: {message}")]
    Spill { stage: String, message: String },
    /// What a stage keeps in memory passed its budget (side inputs).
    #[error("stage {stage}: {message}")]
    OverBudget { stage: String, message: String },
    /// The job was cancelled.
    #[error("job cancelled")]
    Cancelled,
    /// A Weir bug.
    #[error("internal error in Weir's engine (this is a Weir bug): {0}")]
    Internal(String),
}

/// Result alias of the engine.
pub type Result<T> = std::result::Result<T, EngineError>;

/// The message of a caught panic (`&str` or `String` payloads), else a placeholder.
pub fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
