//! Weir's runner harness side of the Fn API: the services SDK harnesses dial
//! (Control, Data, State, Logging, Provision), the environments that start
//! SDK harness processes, and the bundle client implementing the engine's
//! [`weir_engine::BundleProcessor`].
//!
//! Layer: harness. Depends on proto, model, plan and engine; knows nothing of
//! the Job API. Entry types: [`FnApi`] (shared registry of workers, bundles
//! and descriptors), [`services`] (one tonic service per Fn API service),
//! [`JobWorkers`] (a job's SDK workers, the engine's bundle processor),
//! [`boot`] (the PROCESS-environment boot command).

pub mod boot;
pub mod bundle;
pub mod cores;
pub mod environment;
pub mod error;
pub mod expansion;
pub mod fork_server;
pub mod metrics;
pub mod registry;
pub mod resolve;
pub mod services;
pub mod state_values;

pub use bundle::JobWorkers;
pub use error::{HarnessError, Result};
pub use metrics::JobMetrics;
pub use registry::{FnApi, LogSink, SdkLogSink, WorkerLog};

/// This `weir` binary's path, as it was when first asked (`main` asks at
/// start): a rebuild that replaces the file while a server runs turns
/// `current_exe` into `<path> (deleted)`, and the server would refuse its
/// own `weir boot` commands. `None` when the path is unknown.
pub fn weir_exe() -> Option<std::path::PathBuf> {
    static EXE: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    EXE.get_or_init(|| {
        let exe = std::env::current_exe().ok()?;
        // Asked only after the file went: the path it had.
        let text = exe.to_string_lossy();
        Some(match text.strip_suffix(" (deleted)") {
            Some(path) => std::path::PathBuf::from(path),
            None => exe,
        })
    })
    .clone()
}
