//! The job server's TCP connections, guarded: a connection that sends
//! nothing within [`FIRST_BYTES_WAIT`] is closed, and at most
//! [`connection_cap`] are open at once (past that, a new one takes the
//! place of the longest-silent one, or is closed at once), so idle sockets
//! cannot use up the server's file descriptors and freeze the Job API,
//! artifact staging and the Fn API for every job.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// How long a new connection may stay silent: every gRPC client sends the
/// HTTP/2 preface at once.
pub const FIRST_BYTES_WAIT: Duration = Duration::from_secs(10);

/// Connections open at once: each SDK harness holds a few (control, data,
/// state, logging), each client one or two. Lower when the process may
/// open fewer files ([`connection_cap`]).
pub const MAX_CONNECTIONS: usize = 4096;

/// [`MAX_CONNECTIONS`], or half of this process's open-files limit when
/// that is lower (at least 64), so that a flood of connections leaves files
/// for staging, spilling and the harnesses' pipes.
pub fn connection_cap() -> usize {
    let soft = open_files_limit().map_or(u64::MAX, |l| l.rlim_cur as u64);
    MAX_CONNECTIONS.min(usize::try_from(soft / 2).unwrap_or(usize::MAX).max(64))
}

/// This process's limits of open files (soft and hard), if it can read them.
fn open_files_limit() -> Option<libc::rlimit> {
    // SAFETY: getrlimit only writes the struct given.
    unsafe {
        let mut limit = std::mem::zeroed::<libc::rlimit>();
        (libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0).then_some(limit)
    }
}

/// Raises this process's soft limit of open files to its hard limit, as Go
/// programs (Prism) do at start: a server holds sockets for every client and
/// SDK harness, and the usual soft default (1024) is soon reached.
pub fn raise_open_files_limit() {
    if let Some(mut limit) = open_files_limit().filter(|l| l.rlim_cur < l.rlim_max) {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: setrlimit only reads the struct given.
        let _ = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    }
}

/// A connection holding one of the [`MAX_CONNECTIONS`] places until it closes.
pub struct Guarded {
    stream: TcpStream,
    _place: OwnedSemaphorePermit,
}

impl Guarded {
    /// The address of the connection's other end.
    ///
    /// # Errors
    /// The socket's error, e.g. when the peer has gone.
    pub fn peer_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.stream.peer_addr()
    }
}

impl Connected for Guarded {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Guarded {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The connections `listener` accepts, guarded (see the module doc), with
/// TCP_NODELAY set: SDK harnesses wait for each state response before their
/// next request, and with Nagle's algorithm against the client's delayed
/// ACKs every small response waited ~40 ms.
pub fn incoming(listener: TcpListener) -> impl tokio_stream::Stream<Item = io::Result<Guarded>> {
    incoming_with(listener, connection_cap(), FIRST_BYTES_WAIT)
}

/// [`incoming`] with its bounds given.
///
/// At the cap, a new connection takes the place of the connection that has
/// been silent longest (that one is closed), and is refused only when every
/// open connection has spoken: a flood that reconnects each silent socket
/// as soon as it is closed cannot keep gRPC clients, which speak at once,
/// out.
pub fn incoming_with(
    listener: TcpListener,
    max_connections: usize,
    first_bytes_wait: Duration,
) -> impl tokio_stream::Stream<Item = io::Result<Guarded>> {
    let (tx, rx) = mpsc::channel::<io::Result<Guarded>>(64);
    let places = Arc::new(Semaphore::new(max_connections));
    let silent = Arc::new(Silent::default());
    tokio::spawn(async move {
        // When the cap was last reported (at most every 10 s).
        let mut reported: Option<std::time::Instant> = None;
        let mut next_id: u64 = 0;
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors (EMFILE) and the like: wait,
                    // rather than spin, until some close.
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let place = match places.clone().try_acquire_owned() {
                Ok(place) => place,
                // The evicted connection closes its socket, then frees its
                // place: waiting for the place keeps the open sockets at
                // the cap (taking it over at once let a fast flood open a
                // socket for each one not yet closed).
                Err(_) if silent.evict_oldest() => {
                    if due(&mut reported) {
                        tracing::warn!(
                            "{max_connections} connections are open: each new one closes the one silent longest"
                        );
                    }
                    match tokio::time::timeout(EVICTION_WAIT, places.clone().acquire_owned()).await {
                        Ok(Ok(place)) => place,
                        _ => continue,
                    }
                }
                Err(_) => {
                    if due(&mut reported) {
                        tracing::warn!(
                            "{max_connections} connections are open and in use: closing new ones until some close"
                        );
                    }
                    drop(stream);
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            if tx.is_closed() {
                return;
            }
            let id = next_id;
            next_id += 1;
            let evicted = silent.wait(id);
            let (tx, silent) = (tx.clone(), silent.clone());
            tokio::spawn(async move {
                let mut first = [0u8; 1];
                let spoke = tokio::select! {
                    r = tokio::time::timeout(first_bytes_wait, stream.peek(&mut first)) => {
                        matches!(r, Ok(Ok(n)) if n > 0)
                    }
                    _ = evicted => false,
                };
                // False: evicted (its place goes to a newer connection).
                if silent.spoke_or_gone(id) && spoke {
                    let _ = tx.send(Ok(Guarded { stream, _place: place })).await;
                } else {
                    // Silent, closed, failed or evicted: the socket closes
                    // before its place is free.
                    drop(stream);
                    drop(place);
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Whether 10 s have passed since `last` (then it becomes now).
fn due(last: &mut Option<std::time::Instant>) -> bool {
    let now = std::time::Instant::now();
    let due = last.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(10));
    if due {
        *last = Some(now);
    }
    due
}

/// How long a new connection waits for the place of the one it evicted.
const EVICTION_WAIT: Duration = Duration::from_secs(1);

/// The connections that have not sent a byte yet, oldest first, each with
/// the sender that evicts it.
#[derive(Default)]
struct Silent(std::sync::Mutex<std::collections::BTreeMap<u64, oneshot::Sender<()>>>);

impl Silent {
    /// Lists connection `id`; the receiver fires if it is evicted.
    fn wait(&self, id: u64) -> oneshot::Receiver<()> {
        let (evict, evicted) = oneshot::channel();
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(id, evict);
        evicted
    }

    /// Takes connection `id` off the list: false if it was evicted.
    fn spoke_or_gone(&self, id: u64) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(&id).is_some()
    }

    /// Tells the longest-silent connection to close; false if none is silent.
    fn evict_oldest(&self) -> bool {
        let Some((_, evict)) = self.0.lock().unwrap_or_else(|p| p.into_inner()).pop_first() else {
            return false;
        };
        let _ = evict.send(());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_stream::StreamExt;

    #[tokio::test]
    async fn silent_connections_are_closed_and_extra_ones_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = Box::pin(incoming_with(listener, 2, Duration::from_millis(300)));
        // A silent connection is closed after the wait, never served.
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf)).await;
        assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
        // One that speaks is served.
        let mut a = TcpStream::connect(addr).await.unwrap();
        a.write_all(b"PRI").await.unwrap();
        let mut served = incoming.next().await.unwrap().unwrap();
        let mut got = [0u8; 3];
        served.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"PRI");
        // A second fills the places; a third is closed at once.
        let mut b = TcpStream::connect(addr).await.unwrap();
        b.write_all(b"x").await.unwrap();
        let _second = incoming.next().await.unwrap().unwrap();
        let mut c = TcpStream::connect(addr).await.unwrap();
        let _ = c.write_all(b"y").await;
        let refused = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf)).await;
        assert!(matches!(refused, Ok(Ok(0)) | Ok(Err(_))), "{refused:?}");
        // Once one closes, its place is free again.
        drop(served);
        let mut d = TcpStream::connect(addr).await.unwrap();
        d.write_all(b"z").await.unwrap();
        let mut third = tokio::time::timeout(Duration::from_secs(5), incoming.next()).await.unwrap().unwrap().unwrap();
        third.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"z");
    }

    #[tokio::test]
    async fn at_the_cap_a_new_connection_evicts_the_longest_silent_one() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Silent connections would be kept 60 s: only eviction closes them.
        let mut incoming = Box::pin(incoming_with(listener, 2, Duration::from_secs(60)));
        let mut old = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut young = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The cap is reached by two silent ones; a client that speaks gets in...
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(b"PRI").await.unwrap();
        let mut served = tokio::time::timeout(Duration::from_secs(5), incoming.next()).await.unwrap().unwrap().unwrap();
        let mut got = [0u8; 3];
        served.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"PRI");
        // ... in the place of the older silent one, which is closed at once.
        let mut buf = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_secs(5), old.read(&mut buf)).await;
        assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
        // The younger silent one is still open, and served once it speaks.
        young.write_all(b"y").await.unwrap();
        let mut second = tokio::time::timeout(Duration::from_secs(5), incoming.next()).await.unwrap().unwrap().unwrap();
        second.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"y");
        // Both places now hold connections that spoke: a new one is refused.
        let mut late = TcpStream::connect(addr).await.unwrap();
        let _ = late.write_all(b"z").await;
        let refused = tokio::time::timeout(Duration::from_secs(5), late.read(&mut buf)).await;
        assert!(matches!(refused, Ok(Ok(0)) | Ok(Err(_))), "{refused:?}");
    }
}
