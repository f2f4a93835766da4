//! The crate's error type: every decoding failure is either truncated input,
//! structurally invalid input, or a coder the runner cannot interpret.

/// Errors produced while decoding Beam wire data or building coders.
#[derive(thiserror::Error, Debug)]
pub enum Error {
    /// The byte slice ended before a complete `what` (e.g. "varint",
    /// "timestamp") could be read.
    #[error("truncated input while decoding {what}")]
    Truncated {
        /// Short name of the thing being decoded when input ran out.
        what: &'static str,
    },
    /// The bytes (or a coder definition) are well-formed enough to read but
    /// violate Beam's format, e.g. a negative length or an unknown pane
    /// encoding kind. `detail` is a human-readable explanation.
    #[error("invalid {what}: {detail}")]
    Invalid {
        /// Short name of the offending item.
        what: &'static str,
        /// Human-readable explanation.
        detail: String,
    },
    /// The runner was asked to measure or interpret a value whose coder it
    /// does not understand (an [`crate::Coder::Opaque`] not under a
    /// `LengthPrefix`). `urn` is that coder's URN.
    #[error("coder {urn} is not understood by the runner")]
    UnknownCoder {
        /// URN of the coder that could not be interpreted.
        urn: String,
    },
}

/// `std::result::Result` specialised to this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn invalid(what: &'static str, detail: impl Into<String>) -> Error {
        Error::Invalid {
            what,
            detail: detail.into(),
        }
    }
}
