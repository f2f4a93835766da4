//! Cluster mode: one job across several processes and machines, on Timely
//! Dataflow.
//!
//! `weir serve --cluster_port` is the coordinator: it keeps the Job API,
//! artifacts and the UI, and runs no pipeline itself. `weir worker
//! --coordinator host:port` processes register with it; each job runs on
//! `num_workers` of them (Dataflow's worker VMs) as one timely computation,
//! GroupByKey and stateful inputs exchanged by key over timely's TCP
//! transport, side inputs broadcast. Each worker starts its own SDK
//! harnesses and serves their Fn API locally; messages, logs, metrics and
//! the end state flow back to the coordinator ([`protocol`]).

pub mod coordinator;
pub mod protocol;
pub mod worker;

pub use coordinator::Coordinator;
pub use worker::WorkerConfig;
