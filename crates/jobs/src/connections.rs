//! The job server's TCP connections, guarded: a connection that sends
//! nothing within [`FIRST_BYTES_WAIT`] is closed, and at most
//! [`connection_cap`] are open at once (past that, new ones are closed at
//! once), so idle sockets cannot use up the server's file descriptors and
//! freeze the Job API, artifact staging and the Fn API for every job.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
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
pub fn incoming_with(
    listener: TcpListener,
    max_connections: usize,
    first_bytes_wait: Duration,
) -> impl tokio_stream::Stream<Item = io::Result<Guarded>> {
    let (tx, rx) = mpsc::channel::<io::Result<Guarded>>(64);
    let places = Arc::new(Semaphore::new(max_connections));
    tokio::spawn(async move {
        let mut full_logged = false;
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
            let Ok(place) = places.clone().try_acquire_owned() else {
                if !full_logged {
                    tracing::warn!("{max_connections} connections are open: closing new ones until some close");
                    full_logged = true;
                }
                drop(stream);
                continue;
            };
            full_logged = false;
            let _ = stream.set_nodelay(true);
            if tx.is_closed() {
                return;
            }
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut first = [0u8; 1];
                match tokio::time::timeout(first_bytes_wait, stream.peek(&mut first)).await {
                    Ok(Ok(n)) if n > 0 => {
                        let _ = tx.send(Ok(Guarded { stream, _place: place })).await;
                    }
                    // Silent, closed or failed: drop it (and its place).
                    _ => {}
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
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
}
