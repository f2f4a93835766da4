//! Errors the planner reports; every one names the transform, URN or id at fault.

/// A planning failure. All variants are the user's pipeline's fault except
/// [`PlanError::Internal`], which is a Weir bug.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A feature Weir does not implement yet.
    #[error("unsupported: {feature} (transform {transform:?}, URN {urn})")]
    Unsupported {
        transform: String,
        urn: String,
        feature: String,
    },
    /// The pipeline proto is malformed.
    #[error("invalid pipeline: {0}")]
    Invalid(String),
    /// A coder the runner must read is malformed.
    #[error("coder {coder_id}: {source}")]
    Coder {
        coder_id: String,
        source: weir_model::Error,
    },
    /// A Weir bug.
    #[error("internal error in Weir's planner (this is a Weir bug): {0}")]
    Internal(String),
}

/// Result alias of the planner.
pub type Result<T> = std::result::Result<T, PlanError>;
