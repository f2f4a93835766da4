//! Connects the processes of a cluster job attempt to each other, for
//! timely's TCP transport.
//!
//! Timely's own `initialize_networking` waits a whole second between
//! attempts (a job attempt started a second late on every worker), panics on
//! a stranger's bytes and waits forever for a peer that never comes. Here
//! each process listens on its address, dials the processes before it every
//! few milliseconds until they listen, and accepts those after it; a dialer
//! introduces itself with a magic number, the attempt's session (a hash of
//! the attempt's name and address list, the same in every process of the
//! attempt) and its index. Anything else that connects is dropped. Waiting
//! ends when the attempt is cancelled (the coordinator cancels it when a
//! worker is lost) or at a deadline long enough for any worker's SDK
//! harnesses to start first.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::ClusterPeers;

/// First bytes a dialing process sends.
const MAGIC: [u8; 8] = *b"WEIRTMLY";
/// Pause between dials of a peer that does not listen yet, and between
/// polls of the listener.
const RETRY: Duration = Duration::from_millis(5);
/// How long an accepted connection gets to introduce itself.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest single dial.
const DIAL_TIMEOUT: Duration = Duration::from_secs(1);

/// The attempt's session: equal in its processes, different across
/// attempts.
fn session(peers: &ClusterPeers) -> u64 {
    // FNV-1a: stable across builds and processes.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for a in std::iter::once(&peers.session).chain(&peers.addresses) {
        for b in a.bytes().chain([0]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

fn hello(session: u64, index: usize) -> [u8; 24] {
    let mut m = [0u8; 24];
    m[..8].copy_from_slice(&MAGIC);
    m[8..16].copy_from_slice(&session.to_be_bytes());
    m[16..].copy_from_slice(&(index as u64).to_be_bytes());
    m
}

/// The dialer's index if `m` is a hello of this session from a process
/// after `me`.
fn introduced(m: &[u8; 24], session: u64, me: usize, processes: usize) -> Option<usize> {
    if m[..8] != MAGIC || m[8..16] != session.to_be_bytes() {
        return None;
    }
    let index = usize::try_from(u64::from_be_bytes(m[16..].try_into().ok()?)).ok()?;
    (index > me && index < processes).then_some(index)
}

/// Connects to `address` (`host:port`, resolved each time) within `timeout`.
fn dial(address: &str, timeout: Duration) -> Result<TcpStream, String> {
    use std::net::ToSocketAddrs;
    let mut last = format!("{address} resolves to no address");
    for a in address.to_socket_addrs().map_err(|e| e.to_string())? {
        match TcpStream::connect_timeout(&a, timeout.max(Duration::from_millis(1))) {
            Ok(s) => return Ok(s),
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}

/// One connected socket per other process of `peers` (`None` at this
/// process's own index), as timely's `initialize_networking_from_sockets`
/// takes them.
///
/// # Errors
/// Names the address that cannot be listened on, or the processes not
/// connected by `within` (or when `cancel` is set).
pub(crate) fn connect(
    peers: &ClusterPeers,
    within: Duration,
    cancel: &AtomicBool,
) -> Result<Vec<Option<TcpStream>>, String> {
    let (me, n) = (peers.process, peers.addresses.len());
    let session = session(peers);
    let mine = peers
        .addresses
        .get(me)
        .ok_or_else(|| format!("process {me} is not among the attempt's {n} addresses"))?;
    let listener = match &peers.listener {
        Some(held) => held
            .try_clone()
            .map_err(|e| format!("cannot use the timely listener on {mine}: {e}"))?,
        None => TcpListener::bind(mine.as_str())
            .map_err(|e| format!("cannot listen on {mine} for the attempt's other workers: {e}"))?,
    };
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("cannot poll the timely listener on {mine}: {e}"))?;
    let deadline = Instant::now() + within;
    let late = |what: String| {
        if cancel.load(Ordering::SeqCst) {
            Err("the attempt was cancelled while its workers connected".to_string())
        } else if Instant::now() >= deadline {
            Err(format!(
                "{what} within {} s of this worker (process {me} at {mine}) starting",
                within.as_secs()
            ))
        } else {
            Ok(())
        }
    };
    let mut sockets: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    // Dial the processes before this one; each dial is bounded, so that a
    // host dropping SYNs cannot outlast the deadline or a cancel.
    for (i, address) in peers.addresses.iter().enumerate().take(me) {
        let stream = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let last = match dial(address, left.min(DIAL_TIMEOUT)) {
                Ok(mut s) => match s.write_all(&hello(session, me)) {
                    Ok(()) => break s,
                    Err(e) => e.to_string(),
                },
                Err(e) => e,
            };
            late(format!(
                "process {i} at {address} did not accept a connection ({last})"
            ))?;
            std::thread::sleep(RETRY);
        };
        sockets[i] = Some(stream);
    }
    // Accept the processes after it.
    while sockets.iter().skip(me + 1).any(Option::is_none) {
        match listener.accept() {
            Ok((mut s, _)) => {
                let mut m = [0u8; 24];
                let ok = s.set_nonblocking(false).is_ok()
                    && s.set_read_timeout(Some(HELLO_TIMEOUT)).is_ok()
                    && s.read_exact(&mut m).is_ok();
                match introduced(&m, session, me, n) {
                    Some(i) if ok && sockets[i].is_none() => {
                        let _ = s.set_read_timeout(None);
                        sockets[i] = Some(s);
                    }
                    // A stranger, another attempt, or a second dial: dropped.
                    _ => tracing::warn!(
                        process = me,
                        "dropped a connection to the timely port that is not one of this attempt's workers"
                    ),
                }
                late("the attempt's other workers did not connect".to_string())?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let missing: Vec<String> = (me + 1..n)
                    .filter(|&i| sockets[i].is_none())
                    .map(|i| format!("{i} at {}", peers.addresses[i]))
                    .collect();
                late(format!(
                    "process(es) {} did not connect",
                    missing.join(", ")
                ))?;
                std::thread::sleep(RETRY);
            }
            Err(e) => return Err(format!("accepting the attempt's workers on {mine}: {e}")),
        }
    }
    for (i, s) in sockets.iter().enumerate() {
        if let Some(s) = s {
            s.set_nodelay(true)
                .map_err(|e| format!("cannot set the socket to process {i} to nodelay: {e}"))?;
        }
    }
    Ok(sockets)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_address() -> String {
        let l = TcpListener::bind("127.0.0.1:0").expect("binds");
        format!(
            "127.0.0.1:{}",
            l.local_addr().expect("has an address").port()
        )
    }

    fn peers(process: usize, addresses: &[String], session: &str) -> ClusterPeers {
        ClusterPeers {
            process,
            addresses: addresses.to_vec(),
            session: session.into(),
            listener: None,
        }
    }

    fn start(p: ClusterPeers) -> std::thread::JoinHandle<Result<Vec<Option<TcpStream>>, String>> {
        std::thread::spawn(move || connect(&p, Duration::from_secs(10), &AtomicBool::new(false)))
    }

    /// Dials `address` until it listens, sends `bytes` and keeps the
    /// connection open (returned), as a peer would.
    fn dial_and_send(address: &str, bytes: &[u8]) -> TcpStream {
        for _ in 0..2000 {
            if let Ok(mut s) = TcpStream::connect(address) {
                s.write_all(bytes).expect("writes");
                return s;
            }
            std::thread::sleep(RETRY);
        }
        panic!("{address} never listened");
    }

    #[test]
    fn three_processes_connect_each_to_the_others_and_strangers_are_dropped() {
        let addresses: Vec<String> = (0..3).map(|_| free_address()).collect();
        // Process 0 listens alone first; a stranger and a process of another
        // attempt (same addresses, other session) are in its backlog before
        // the real peers dial, so it must read and drop both.
        let zero = start(peers(0, &addresses, "attempt-2"));
        let _stranger = dial_and_send(&addresses[0], b"GET / HTTP/1.0\r\n\r\n......");
        let other = hello(session(&peers(2, &addresses, "attempt-1")), 2);
        let _other_attempt = dial_and_send(&addresses[0], &other);
        let rest: Vec<_> = (1..3)
            .map(|i| start(peers(i, &addresses, "attempt-2")))
            .collect();
        let sockets: Vec<Vec<Option<TcpStream>>> = std::iter::once(zero)
            .chain(rest)
            .map(|h| h.join().expect("no panic").expect("connects"))
            .collect();
        for (me, s) in sockets.iter().enumerate() {
            let connected: Vec<usize> = (0..3).filter(|&i| s[i].is_some()).collect();
            let others: Vec<usize> = (0..3).filter(|&i| i != me).collect();
            assert_eq!(connected, others, "process {me}");
        }
        // The sockets pair up: what 2 writes to 0 arrives at 0 from 2 (not
        // from the stranger or the other attempt).
        sockets[2][0]
            .as_ref()
            .expect("2 → 0")
            .write_all(b"x")
            .expect("writes");
        let mut b = [0u8; 1];
        (&*sockets[0][2].as_ref().expect("0 ← 2"))
            .read_exact(&mut b)
            .expect("reads");
        assert_eq!(&b, b"x");
    }

    #[test]
    fn a_peer_that_never_comes_fails_the_attempt_naming_it() {
        let addresses: Vec<String> = (0..2).map(|_| free_address()).collect();
        let zero = peers(0, &addresses, "a");
        let e = connect(&zero, Duration::from_millis(200), &AtomicBool::new(false)).unwrap_err();
        assert!(
            e.contains(&format!("1 at {}", addresses[1])) && e.contains("did not connect"),
            "{e}"
        );
        let cancelled =
            connect(&zero, Duration::from_secs(10), &AtomicBool::new(true)).unwrap_err();
        assert!(cancelled.contains("cancelled"), "{cancelled}");
        // A dialer whose peer never listens fails too, naming it.
        let one = peers(1, &addresses, "a");
        let e = connect(&one, Duration::from_millis(200), &AtomicBool::new(false)).unwrap_err();
        assert!(e.contains(&format!("process 0 at {}", addresses[0])), "{e}");
    }

    #[test]
    fn hellos_of_other_sessions_or_indices_are_refused() {
        let three = ["a:1".to_string(), "b:2".into(), "c:3".into()];
        let s = session(&peers(0, &three, "x"));
        assert_eq!(introduced(&hello(s, 2), s, 0, 3), Some(2));
        assert_eq!(introduced(&hello(s, 0), s, 0, 3), None, "itself");
        assert_eq!(introduced(&hello(s, 3), s, 0, 3), None, "out of range");
        assert_eq!(
            introduced(&hello(s + 1, 2), s, 0, 3),
            None,
            "another session"
        );
        let mut bad = hello(s, 2);
        bad[0] = b'X';
        assert_eq!(introduced(&bad, s, 0, 3), None, "no magic");
        let other_port = ["a:1".to_string(), "b:2".into(), "c:4".into()];
        assert_ne!(s, session(&peers(0, &other_port, "x")));
        assert_ne!(
            s,
            session(&peers(0, &three, "y")),
            "another attempt, same ports"
        );
    }
}
