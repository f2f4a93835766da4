//! Beam's data model as the runner sees it: timestamps, windows, panes, coders, windowed values. Pure; no I/O, no protos.
//!
//! Conventions used throughout the crate:
//! * Timestamps are **milliseconds since the Unix epoch** held in an `i64`
//!   ([`Timestamp`]). Beam's `MIN_TIMESTAMP` / `MAX_TIMESTAMP` (defined in
//!   microseconds as `i64::MIN` / `i64::MAX`) become [`Timestamp::MIN`] /
//!   [`Timestamp::MAX`] = `i64::MIN / 1000` / `i64::MAX / 1000` milliseconds.
//! * All encodings are Beam's standard coder wire formats in the **nested**
//!   (a.k.a. outer-with-length) context, i.e. the form used inside `kv`,
//!   `iterable` and on the Fn API data plane.
//! * Values the runner does not interpret are carried as their encoded bytes
//!   (`Vec<u8>` / `&[u8]`); [`Coder::encoded_len`] is what lets the runner find
//!   where one encoded value ends.

pub mod coder;
pub mod error;
pub mod pane;
pub mod timestamp;
pub mod varint;
pub mod window;
pub mod windowed_value;

pub use coder::Coder;
pub use error::{Error, Result};
pub use pane::{PaneInfo, PaneTiming};
pub use timestamp::Timestamp;
pub use window::Window;
pub use windowed_value::WindowedValue;
