//! Pinning SDK harness processes that run on one core each (Python's, one
//! per core) to a core of their own, on Linux.
//!
//! A Python harness runs its bundles under one interpreter lock. When a
//! second bundle fills the first one's waits (a source that sleeps after
//! every record, I/O), the lock passes between its threads at every wait;
//! on a core of its own each pass is a switch on that core, not a wake-up
//! on another core that the other harness is using. Measured on 2 cores,
//! Beam's load tests at 1M records under PROCESS took 14–21% less CPU and
//! 7–9% less wall time pinned.
//!
//! The cores are those this process may run on (`sched_getaffinity`, read
//! at the first pin), and only when they are no more than the cores Weir
//! counts ([`weir_engine::machine_cores`]): under a CPU quota smaller than
//! the CPU set (a container's limit), harnesses are left to the kernel.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turns pinning on or off for the harnesses started from now on
/// (`weir serve --pin_sdk_harnesses`).
pub fn set_enabled(enabled: bool) {
    ENABLED.store(enabled, Ordering::Relaxed);
}

/// The cores harnesses are pinned to, and the live pins on each.
#[derive(Debug)]
struct Cores {
    cpus: Vec<usize>,
    pins: Mutex<Pins>,
}

/// Live pins per core (indexed as [`Cores::cpus`]): in all, and per group
/// of harnesses that should not share a core (a job's environment).
#[derive(Debug, Default)]
struct Pins {
    total: Vec<usize>,
    by_group: HashMap<String, Vec<usize>>,
    /// Where the next tie is broken: ties go round the cores, so the first
    /// harness of each job does not always land on the first core.
    cursor: usize,
}

impl Cores {
    fn new(cpus: Vec<usize>) -> Self {
        let total = vec![0; cpus.len()];
        Cores {
            cpus,
            pins: Mutex::new(Pins {
                total,
                ..Pins::default()
            }),
        }
    }

    /// A core for one more harness of `group`: the one with the fewest of
    /// the group's pins, then the fewest pins in all, then the next from the
    /// cursor. `None` when there are no cores.
    fn take(&'static self, group: &str) -> Option<CorePin> {
        let n = self.cpus.len();
        let mut pins = self.pins.lock().unwrap_or_else(|p| p.into_inner());
        let Pins { total, by_group, cursor } = &mut *pins;
        let mine = by_group.entry(group.to_string()).or_insert_with(|| vec![0; n]);
        let slot = (0..n).min_by_key(|&i| (mine[i], total[i], (i + n - *cursor % n) % n))?;
        mine[slot] += 1;
        total[slot] += 1;
        *cursor = slot + 1;
        Some(CorePin {
            of: self,
            slot,
            group: group.to_string(),
        })
    }
}

fn cores() -> &'static Cores {
    static CORES: OnceLock<Cores> = OnceLock::new();
    CORES.get_or_init(|| {
        let cpus = allowed_cpus().unwrap_or_default();
        // A quota below the CPU set: pinning would crowd the first cores.
        if cpus.len() > weir_engine::machine_cores() {
            return Cores::new(vec![]);
        }
        Cores::new(cpus)
    })
}

/// One harness's core, held while the harness runs; dropping it frees the
/// core for the next pin.
#[derive(Debug)]
pub struct CorePin {
    of: &'static Cores,
    slot: usize,
    group: String,
}

impl CorePin {
    /// The CPU number (as in `/proc/cpuinfo`) the harness runs on.
    pub fn cpu(&self) -> usize {
        self.of.cpus[self.slot]
    }
}

impl Drop for CorePin {
    fn drop(&mut self) {
        let mut pins = self.of.pins.lock().unwrap_or_else(|p| p.into_inner());
        pins.total[self.slot] = pins.total[self.slot].saturating_sub(1);
        if let Some(g) = pins.by_group.get_mut(&self.group) {
            g[self.slot] = g[self.slot].saturating_sub(1);
            if g.iter().all(|&c| c == 0) {
                pins.by_group.remove(&self.group);
            }
        }
    }
}

/// A core for one more one-core harness of `group` (harnesses of one group,
/// a job's environment, go to different cores first; see [`Cores::take`]).
/// `None` when pinning is off, when this process may run on fewer than two
/// cores or on more than [`weir_engine::machine_cores`], or off Linux.
pub fn pin(group: &str) -> Option<CorePin> {
    if !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    let cores = cores();
    if cores.cpus.len() < 2 {
        return None;
    }
    cores.take(group)
}

/// The CPUs the calling thread may run on, in increasing order; `None` off
/// Linux or when the kernel does not say (more CPUs than a `cpu_set_t`
/// holds, 1024 with glibc).
pub fn allowed_cpus() -> Option<Vec<usize>> {
    #[cfg(target_os = "linux")]
    {
        let bits = 8 * std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: `set` is a plain bit set the kernel fills in; its size is
        // passed along, and CPU_ISSET reads only below it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return None;
            }
            Some((0..bits).filter(|&c| libc::CPU_ISSET(c, &set)).collect())
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// Makes `command`'s process run on `cpu` only (set between fork and exec;
/// its threads and children inherit it). When the kernel refuses (the CPU
/// left this process's set since), the process runs unpinned. Does nothing
/// off Linux.
pub fn run_on(command: &mut tokio::process::Command, cpu: usize) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: the closure runs in the forked child before exec and only
        // makes the async-signal-safe sched_setaffinity system call on a set
        // built here, before the fork.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            command.pre_exec(move || {
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (command, cpu);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaked(cpus: Vec<usize>) -> &'static Cores {
        Box::leak(Box::new(Cores::new(cpus)))
    }

    #[test]
    fn a_groups_harnesses_go_to_different_cores_and_pins_come_back_when_dropped() {
        let cores = leaked(vec![3, 5, 6]);
        let a = cores.take("job-a/py").unwrap();
        let b = cores.take("job-a/py").unwrap();
        let c = cores.take("job-a/py").unwrap();
        assert_eq!((a.cpu(), b.cpu(), c.cpu()), (3, 5, 6));
        // Every core has one: the next goes round from the cursor.
        let d = cores.take("job-a/py").unwrap();
        assert_eq!(d.cpu(), 3);
        drop(b);
        let e = cores.take("job-a/py").unwrap();
        assert_eq!(e.cpu(), 5);
        assert_eq!(cores.pins.lock().unwrap().total, vec![2, 1, 1]);
        drop((a, c, d, e));
        let pins = cores.pins.lock().unwrap();
        assert_eq!(pins.total, vec![0, 0, 0]);
        assert!(pins.by_group.is_empty());
    }

    #[test]
    fn two_jobs_starting_together_each_get_both_cores() {
        let cores = leaked(vec![0, 1]);
        // Interleaved, as two jobs' launches run concurrently.
        let a1 = cores.take("a/py").unwrap();
        let b1 = cores.take("b/py").unwrap();
        let a2 = cores.take("a/py").unwrap();
        let b2 = cores.take("b/py").unwrap();
        assert_ne!(a1.cpu(), a2.cpu());
        assert_ne!(b1.cpu(), b2.cpu());
        // A lone job's first harness does not always take core 0.
        drop((a1, a2, b1, b2));
        let x = cores.take("c/py").unwrap();
        let y = cores.take("d/py").unwrap();
        assert_ne!(x.cpu(), y.cpu());
    }

    #[test]
    fn no_cores_no_pin() {
        assert!(leaked(vec![]).take("a/py").is_none());
    }

    #[tokio::test]
    async fn a_pinned_command_runs_on_its_core_only() {
        let Some(cpus) = allowed_cpus().filter(|c| c.len() >= 2) else {
            return;
        };
        let cpu = *cpus.last().unwrap();
        let mut cmd = tokio::process::Command::new("grep");
        cmd.args(["^Cpus_allowed_list:", "/proc/self/status"]);
        run_on(&mut cmd, cpu);
        let out = cmd.output().await.unwrap();
        let line = String::from_utf8(out.stdout).unwrap();
        assert_eq!(line.split_whitespace().last(), Some(cpu.to_string().as_str()), "{line}");
    }

    #[tokio::test]
    async fn a_cpu_outside_the_set_leaves_the_command_unpinned() {
        let Some(cpus) = allowed_cpus() else {
            return;
        };
        let outside = (0..1024).find(|c| !cpus.contains(c)).unwrap();
        let mut cmd = tokio::process::Command::new("true");
        run_on(&mut cmd, outside);
        assert!(cmd.status().await.unwrap().success());
    }
}
