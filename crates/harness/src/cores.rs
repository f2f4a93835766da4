//! Pinning SDK harness processes that run on one core each (Python's, one
//! per core) to a core of their own, on Linux.
//!
//! A Python harness runs its bundles under one interpreter lock. When a
//! second bundle fills the first one's waits (a source that sleeps after
//! every record, I/O), the lock passes between its threads at every wait;
//! on a core of its own each pass is a switch on that core, not a wake-up
//! on another core that the other harness is using. Measured on 2 cores,
//! Beam's load tests at 1M records under PROCESS: combine 17.6 CPU s pinned
//! against 20.6 unpinned, GroupByKey 30.6 against 33.9, wall time the same
//! or lower.
//!
//! The cores are those this process may run on (`sched_getaffinity`), each
//! pin taking the one with the fewest live pins, so concurrent jobs share
//! the cores evenly. `weir boot` passes its own affinity on to a harness
//! its fork server forks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turns pinning on or off for the harnesses started from now on
/// (`weir serve --pin_sdk_harnesses`).
pub fn set_enabled(enabled: bool) {
    ENABLED.store(enabled, Ordering::Relaxed);
}

/// The cores this process may run on, and how many live pins each has.
#[derive(Debug)]
struct Cores {
    cpus: Vec<usize>,
    pins: Mutex<Vec<usize>>,
}

fn cores() -> &'static Cores {
    static CORES: OnceLock<Cores> = OnceLock::new();
    CORES.get_or_init(|| {
        let cpus = allowed_cpus().unwrap_or_default();
        let pins = Mutex::new(vec![0; cpus.len()]);
        Cores { cpus, pins }
    })
}

/// One harness's core, held while the harness runs; dropping it frees the
/// core for the next pin.
#[derive(Debug)]
pub struct CorePin {
    of: &'static Cores,
    slot: usize,
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
        pins[self.slot] = pins[self.slot].saturating_sub(1);
    }
}

/// A core for one more one-core harness: the allowed core with the fewest
/// live pins (the lowest-numbered of those). `None` when pinning is off,
/// when this process may run on fewer than two cores, or off Linux.
pub fn pin() -> Option<CorePin> {
    if !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    let cores = cores();
    if cores.cpus.len() < 2 {
        return None;
    }
    cores.take()
}

impl Cores {
    /// The core with the fewest live pins, pinned once more.
    fn take(&'static self) -> Option<CorePin> {
        let mut pins = self.pins.lock().unwrap_or_else(|p| p.into_inner());
        let slot = (0..pins.len()).min_by_key(|&i| pins[i])?;
        pins[slot] += 1;
        Some(CorePin { of: self, slot })
    }
}

/// The CPUs the calling thread may run on, in increasing order; `None` off
/// Linux or when the kernel does not say.
pub fn allowed_cpus() -> Option<Vec<usize>> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `set` is a plain bit set the kernel fills in; its size is
        // passed along.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return None;
            }
            Some(
                (0..libc::CPU_SETSIZE as usize)
                    .filter(|&c| libc::CPU_ISSET(c, &set))
                    .collect(),
            )
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// Makes `command`'s process run on `cpu` only (set between fork and exec;
/// its threads and children inherit it). Does nothing off Linux.
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
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
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

    #[test]
    fn pins_go_to_the_least_pinned_core_and_come_back_when_dropped() {
        let cores: &'static Cores = Box::leak(Box::new(Cores {
            cpus: vec![3, 5, 6],
            pins: Mutex::new(vec![0; 3]),
        }));
        let a = cores.take().unwrap();
        let b = cores.take().unwrap();
        let c = cores.take().unwrap();
        assert_eq!((a.cpu(), b.cpu(), c.cpu()), (3, 5, 6));
        // Every core has one: the next goes to the lowest-numbered.
        let d = cores.take().unwrap();
        assert_eq!(d.cpu(), 3);
        drop(b);
        assert_eq!(cores.take().unwrap().cpu(), 5);
        // (That pin was dropped at once: 5 is free again.)
        assert_eq!(*cores.pins.lock().unwrap(), vec![2, 0, 1]);
        drop((a, c, d));
        assert_eq!(*cores.pins.lock().unwrap(), vec![0, 0, 0]);
    }

    #[test]
    fn no_pins_when_turned_off() {
        set_enabled(false);
        assert!(pin().is_none());
        set_enabled(true);
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
}
