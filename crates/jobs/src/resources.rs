//! CPU and memory of a job: the Weir server process (the runner) and the
//! SDK harness processes Weir started for the job, reported by GetJobMetrics
//! as MonitoringInfos with Weir's own URNs ([`URNS`]).
//!
//! SDK processes are found with `sysinfo`: for a PROCESS environment Weir
//! runs `<command> --id=<job id>-worker-N ...` as its own child; `weir boot`
//! then execs the Python SDK harness in the same process, whose command line
//! no longer names the worker but whose environment has
//! `WORKER_ID=<job id>-worker-N`. A process counts for the job when it is a
//! descendant of this server and its command line or environment names a
//! worker of the job; its own children count too, and so does the harness
//! that Weir's Python fork server forked for that `weir boot` (its pid in
//! the worker's folder). In LOOPBACK (and for
//! EXTERNAL worker pools) the SDK harness runs in another process that Weir
//! did not start, so only the runner is measured and the SDK process count
//! is 0.
//!
//! The runner figures are the whole server process (it may run several jobs
//! at once): CPU used since the job was started and the resident memory.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System, UpdateKind};
use weir_proto::beam;
use weir_proto::urns::monitoring as m;

/// CPU milliseconds the Weir server process used since the job started
/// (`beam:metrics:sum_int64:v1`).
pub const RUNNER_CPU_MSECS: &str = "weir:metric:runner:cpu_msecs:v1";
/// Resident memory of the Weir server process, bytes (`latest_int64`).
pub const RUNNER_MEMORY_BYTES: &str = "weir:metric:runner:memory_bytes:v1";
/// Largest resident memory of the server seen while the job ran, bytes (`latest_int64`).
pub const RUNNER_PEAK_MEMORY_BYTES: &str = "weir:metric:runner:peak_memory_bytes:v1";
/// CPU milliseconds of the job's SDK processes, summed (`sum_int64`).
pub const SDK_CPU_MSECS: &str = "weir:metric:sdk:cpu_msecs:v1";
/// Resident memory of the job's live SDK processes, summed, bytes (`latest_int64`).
pub const SDK_MEMORY_BYTES: &str = "weir:metric:sdk:memory_bytes:v1";
/// Largest summed resident memory of the SDK processes seen, bytes (`latest_int64`).
pub const SDK_PEAK_MEMORY_BYTES: &str = "weir:metric:sdk:peak_memory_bytes:v1";
/// Number of SDK processes of the job seen so far (`latest_int64`); 0 in LOOPBACK.
pub const SDK_PROCESSES: &str = "weir:metric:sdk:processes:v1";

/// Every Weir resource URN with its metric type.
pub const URNS: &[(&str, &str)] = &[
    (RUNNER_CPU_MSECS, m::TYPE_SUM_INT64),
    (RUNNER_MEMORY_BYTES, m::TYPE_LATEST_INT64),
    (RUNNER_PEAK_MEMORY_BYTES, m::TYPE_LATEST_INT64),
    (SDK_CPU_MSECS, m::TYPE_SUM_INT64),
    (SDK_MEMORY_BYTES, m::TYPE_LATEST_INT64),
    (SDK_PEAK_MEMORY_BYTES, m::TYPE_LATEST_INT64),
    (SDK_PROCESSES, m::TYPE_LATEST_INT64),
];

/// How often a running job is sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// Samples a job keeps for charts: 20 minutes at one a second.
pub const HISTORY_SAMPLES: usize = 1200;

/// One job's resource figures, updated by [`Sampler::sample`].
#[derive(Default)]
pub struct JobResources {
    inner: Mutex<Usage>,
    /// The last [`HISTORY_SAMPLES`] samples, oldest first.
    history: Mutex<std::collections::VecDeque<Sample>>,
}

/// One sample of a job's figures, for charts over time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// When, ms since the Unix epoch.
    pub at_ms: u64,
    /// Server CPU ms since the job started, and its resident memory (bytes).
    pub runner_cpu_ms: u64,
    pub runner_memory: u64,
    /// CPU ms of the job's SDK processes, and their summed resident memory (bytes).
    pub sdk_cpu_ms: u64,
    pub sdk_memory: u64,
}

#[derive(Default, Clone, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Server CPU time when the job started, ms.
    pub runner_cpu_start_ms: Option<u64>,
    pub runner_cpu_ms: u64,
    pub runner_memory: u64,
    pub runner_peak_memory: u64,
    /// Latest accumulated CPU time of each SDK process ever seen, ms.
    pub sdk_cpu_by_pid: HashMap<u32, u64>,
    pub sdk_memory: u64,
    pub sdk_peak_memory: u64,
    /// When the figures were last updated.
    pub sampled_at: Option<SystemTime>,
}

impl Usage {
    /// CPU ms of all SDK processes seen.
    pub fn sdk_cpu_ms(&self) -> u64 {
        self.sdk_cpu_by_pid.values().sum()
    }
}

fn varint(v: u64, out: &mut Vec<u8>) {
    let mut v = v;
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

impl JobResources {
    /// The samples kept so far, oldest first.
    pub fn history(&self) -> Vec<Sample> {
        self.history.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().collect()
    }

    /// A copy of the current figures.
    pub fn usage(&self) -> Usage {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The figures as MonitoringInfos: sums are a varint, gauges a varint
    /// timestamp (ms since the epoch) then a varint value (metrics.proto).
    /// No PTRANSFORM label: the Python SDK's `PipelineResult.metrics()`
    /// lists them under namespace `weir` with no step, so filters by step
    /// or by a user metric's name never match them.
    pub fn monitoring_infos(&self) -> Vec<beam::MonitoringInfo> {
        let u = self.usage();
        if u.sampled_at.is_none() {
            return vec![];
        }
        let at = u
            .sampled_at
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as u64);
        let value = |urn: &str| match urn {
            RUNNER_CPU_MSECS => u.runner_cpu_ms,
            RUNNER_MEMORY_BYTES => u.runner_memory,
            RUNNER_PEAK_MEMORY_BYTES => u.runner_peak_memory,
            SDK_CPU_MSECS => u.sdk_cpu_ms(),
            SDK_MEMORY_BYTES => u.sdk_memory,
            SDK_PEAK_MEMORY_BYTES => u.sdk_peak_memory,
            _ => u.sdk_cpu_by_pid.len() as u64,
        };
        URNS.iter()
            .map(|(urn, ty)| {
                let mut payload = Vec::new();
                if *ty == m::TYPE_LATEST_INT64 {
                    varint(at, &mut payload);
                }
                varint(value(urn), &mut payload);
                beam::MonitoringInfo {
                    urn: urn.to_string(),
                    r#type: ty.to_string(),
                    payload,
                    ..Default::default()
                }
            })
            .collect()
    }
}

/// Reads process figures with `sysinfo`; one per server.
pub struct Sampler {
    system: Mutex<Option<System>>,
    me: Pid,
}

impl Default for Sampler {
    fn default() -> Self {
        Sampler {
            system: Mutex::new(None),
            me: Pid::from_u32(std::process::id()),
        }
    }
}

/// Whether a process's command line or environment names a worker of `job_id`.
pub fn names_worker_of(job_id: &str, cmd: &[String], environ: &[String]) -> bool {
    let worker = format!("{job_id}-worker-");
    let arg = format!("--id={worker}");
    let env = format!("WORKER_ID={worker}");
    cmd.iter().any(|a| a.starts_with(&arg))
        || cmd
            .windows(2)
            .any(|w| w[0] == "--id" && w[1].starts_with(&worker))
        || environ.iter().any(|e| e.starts_with(&env))
}

/// The pid of the Python SDK harness that the fork server forked for the
/// `weir boot` with command line `cmd`: written by `weir boot` to
/// `<--semi_persist_dir>/harness.pid` (`weir_harness::boot::HARNESS_PID_FILE`).
fn forked_harness(cmd: &[String]) -> Option<Pid> {
    let dir = cmd.iter().find_map(|a| a.strip_prefix("--semi_persist_dir="))?;
    weir_harness::boot::forked_harness_pid(std::path::Path::new(dir)).map(Pid::from_u32)
}

impl Sampler {
    /// Updates `resources` of job `job_id` from the processes now running.
    /// The first call for a job records the server's CPU time as its start.
    pub fn sample(&self, job_id: &str, resources: &JobResources) {
        let mut guard = self.system.lock().unwrap_or_else(|p| p.into_inner());
        let system = match guard.as_mut() {
            Some(s) => s,
            None => match System::new_with_specifics(sysinfo::RefreshKind::nothing()) {
                Ok(s) => guard.insert(s),
                Err(e) => {
                    tracing::debug!("sysinfo unavailable: {e}");
                    return;
                }
            },
        };
        // CPU, memory and parents of every process; then command lines and
        // environments of this server's descendants only. Without tasks:
        // sysinfo lists a Linux process's threads as its children, each with
        // the whole process's memory and CPU, which summed them many times.
        system.refresh_processes_specifics(
            ProcessesToUpdate::All,
            true,
            ProcessRefreshKind::nothing().with_cpu().with_memory().without_tasks(),
        );
        let mut children: HashMap<Pid, Vec<Pid>> = HashMap::new();
        for (pid, p) in system.processes() {
            if let Some(parent) = p.parent() {
                children.entry(parent).or_default().push(*pid);
            }
        }
        let descendants = |root: Pid| {
            let mut out = vec![];
            let mut stack = children.get(&root).cloned().unwrap_or_default();
            while let Some(p) = stack.pop() {
                out.push(p);
                stack.extend(children.get(&p).cloned().unwrap_or_default());
            }
            out
        };
        let mine = descendants(self.me);
        system.refresh_processes_specifics(
            ProcessesToUpdate::Some(&mine),
            false,
            ProcessRefreshKind::nothing()
                .without_tasks()
                .with_cmd(UpdateKind::Always)
                .with_environ(UpdateKind::Always),
        );
        let text = |v: &[std::ffi::OsString]| -> Vec<String> {
            v.iter().map(|s| s.to_string_lossy().into_owned()).collect()
        };
        let mut job_pids: HashSet<Pid> = HashSet::new();
        for pid in &mine {
            if job_pids.contains(pid) {
                continue;
            }
            let Some(p) = system.process(*pid) else {
                continue;
            };
            let cmd = text(p.cmd());
            if names_worker_of(job_id, &cmd, &text(p.environ())) {
                job_pids.insert(*pid);
                job_pids.extend(descendants(*pid));
                // A harness forked by the Python fork server stands behind
                // this `weir boot`.
                if let Some(forked) = forked_harness(&cmd).filter(|f| mine.contains(f)) {
                    job_pids.insert(forked);
                    job_pids.extend(descendants(forked));
                }
            }
        }
        let mut u = resources.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(me) = system.process(self.me) {
            let cpu = me.accumulated_cpu_time();
            let start = *u.runner_cpu_start_ms.get_or_insert(cpu);
            u.runner_cpu_ms = cpu.saturating_sub(start);
            u.runner_memory = me.memory();
            u.runner_peak_memory = u.runner_peak_memory.max(u.runner_memory);
        }
        let mut memory = 0;
        for pid in &job_pids {
            if let Some(p) = system.process(*pid) {
                let cpu = u.sdk_cpu_by_pid.entry(pid.as_u32()).or_default();
                *cpu = (*cpu).max(p.accumulated_cpu_time());
                memory += p.memory();
            }
        }
        u.sdk_memory = memory;
        u.sdk_peak_memory = u.sdk_peak_memory.max(memory);
        let now = SystemTime::now();
        u.sampled_at = Some(now);
        let sample = Sample {
            at_ms: now.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
            runner_cpu_ms: u.runner_cpu_ms,
            runner_memory: u.runner_memory,
            sdk_cpu_ms: u.sdk_cpu_ms(),
            sdk_memory: u.sdk_memory,
        };
        drop(u);
        let mut history = resources.history.lock().unwrap_or_else(|p| p.into_inner());
        if history.len() >= HISTORY_SAMPLES {
            history.pop_front();
        }
        history.push_back(sample);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_ids_are_found_in_command_lines_and_environments() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let boot = s(&[
            "/bin/weir",
            "boot",
            "--id=job-abc-worker-3",
            "--provision_endpoint=x",
        ]);
        assert!(names_worker_of("job-abc", &boot, &[]));
        assert!(
            !names_worker_of("job-ab", &boot, &[]),
            "a prefix of the id is another job"
        );
        assert!(names_worker_of(
            "job-abc",
            &s(&["sdk", "--id", "job-abc-worker-0"]),
            &[]
        ));
        let python = s(&["python", "-m", "apache_beam.runners.worker.sdk_worker_main"]);
        assert!(!names_worker_of("job-abc", &python, &s(&["HOME=/root"])));
        assert!(names_worker_of(
            "job-abc",
            &python,
            &s(&["HOME=/root", "WORKER_ID=job-abc-worker-12"])
        ));
    }

    #[test]
    fn a_child_process_is_measured_for_its_job() {
        // A child of this (test) process whose environment names a worker.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env("WORKER_ID", "job-measured-worker-0")
            .spawn()
            .expect("sleep");
        let sampler = Sampler::default();
        let r = JobResources::default();
        let other = JobResources::default();
        sampler.sample("job-measured", &r);
        sampler.sample("job-other", &other);
        let _ = child.kill();
        let _ = child.wait();
        let u = r.usage();
        assert_eq!(
            u.sdk_cpu_by_pid.keys().copied().collect::<Vec<_>>(),
            vec![child.id()]
        );
        assert!(u.sdk_memory > 0, "{u:?}");
        assert!(u.runner_memory > 0, "{u:?}");
        assert_eq!(other.usage().sdk_cpu_by_pid.len(), 0);
        let infos = r.monitoring_infos();
        assert_eq!(infos.len(), URNS.len());
        let procs = infos.iter().find(|i| i.urn == SDK_PROCESSES).unwrap();
        assert_eq!(procs.r#type, m::TYPE_LATEST_INT64);
        // Timestamp varint, then the count 1.
        assert_eq!(*procs.payload.last().unwrap(), 1);
    }

    #[test]
    fn a_multithreaded_harness_counts_once() {
        // Five threads: sysinfo lists each as a process unless told not to.
        let mut child = std::process::Command::new("python3")
            .args(["-c", "import threading,time\nfor _ in range(4): threading.Thread(target=time.sleep, args=(30,)).start()\nprint(flush=True)\ntime.sleep(30)"])
            .env("WORKER_ID", "job-threads-worker-0")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
        let rss_kb: u64 = std::fs::read_to_string(format!("/proc/{}/status", child.id()))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        let sampler = Sampler::default();
        let r = JobResources::default();
        sampler.sample("job-threads", &r);
        let _ = child.kill();
        let _ = child.wait();
        let u = r.usage();
        assert_eq!(u.sdk_cpu_by_pid.keys().copied().collect::<Vec<_>>(), vec![child.id()]);
        let rss = rss_kb * 1024;
        assert!(u.sdk_memory < rss * 3 / 2, "sdk memory {} for a process of {rss} bytes", u.sdk_memory);
    }

    #[test]
    fn payloads_are_varints() {
        let mut out = vec![];
        varint(300, &mut out);
        assert_eq!(out, vec![0xac, 0x02]);
        assert!(JobResources::default().monitoring_infos().is_empty());
    }
}
