//! The door of each port: accepting connections without letting silent clients or the file-descriptor limit
//! take the server down.
//!
//! - **Silent connections.** hyper waits for a connection's HTTP/2 preface without a deadline, and HTTP/2
//!   keepalive pings start only once it has arrived, so a connection that sent nothing held a descriptor and
//!   a task for ever. [`Incoming`] hands a gRPC connection to tonic only once it has completed its TLS
//!   handshake (if any) and sent the 24-byte preface within the handshake timeout of being accepted, and
//!   closes it otherwise. From then on keepalive pings close peers that stop answering. (The HTTP port uses
//!   hyper's header read timeout instead, see [`crate::http::serve`].)
//! - **The descriptor limit.** There `accept` fails with `EMFILE` but the connection stays queued, so the
//!   listener stays readable and a loop that retries at once spins a core (tonic's did: ~95% of one, with
//!   nothing to serve). [`Acceptor`] counts such errors in `existence_accept_errors_total`, warns at most once
//!   per 10 s, and retries after a backoff of 5 ms doubling up to 1 s, reset by the next accepted connection.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Sleep;
use tokio_stream::Stream;
use tonic::transport::server::Connected;

/// The first wait after an accept failed for want of a resource.
const FIRST_BACKOFF: Duration = Duration::from_millis(5);
/// The longest wait between retries, so also the longest a server that got its descriptors back takes to
/// accept again.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// While accepts keep failing, one warning per this long (each failure is counted).
const WARNING_INTERVAL: Duration = Duration::from_secs(10);
/// Length of the HTTP/2 client connection preface (`PRI * HTTP/2.0...`, RFC 9113 §3.4).
pub const PREFACE_LEN: usize = 24;

/// A listening socket whose accepts never fail: an error that concerns one connection skips it, any other
/// (a resource the process ran out of) backs off.
#[derive(Debug)]
pub struct Acceptor {
    listener: TcpListener,
    /// `grpc` or `http`, for logs and the metric.
    port: &'static str,
    /// The next backoff.
    backoff: Duration,
    /// The backoff under way.
    sleep: Option<Pin<Box<Sleep>>>,
    /// Failures since the last warning.
    unreported: u64,
    warned_at: Option<Instant>,
}

impl Acceptor {
    /// Accepts on `listener`; `port` names it in logs and metrics.
    pub fn new(listener: TcpListener, port: &'static str) -> Self {
        Self {
            listener,
            port,
            backoff: FIRST_BACKOFF,
            sleep: None,
            unreported: 0,
            warned_at: None,
        }
    }

    /// The next connection.
    pub fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<TcpStream> {
        loop {
            if let Some(sleep) = &mut self.sleep {
                ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
            }
            // tokio's budget makes this return `Pending` now and then, so a stream of failures that each
            // skip one connection cannot starve the other tasks.
            match ready!(self.listener.poll_accept(cx)) {
                Ok((stream, _)) => {
                    self.backoff = FIRST_BACKOFF;
                    return Poll::Ready(stream);
                }
                Err(error) => match resource_shortage(&error) {
                    None => {
                        tracing::debug!(port = self.port, %error, "accept failed for one connection")
                    }
                    Some(reason) => self.back_off(reason, &error),
                },
            }
        }
    }

    /// The next connection.
    pub async fn accept(&mut self) -> TcpStream {
        std::future::poll_fn(|cx| self.poll_accept(cx)).await
    }

    fn back_off(&mut self, reason: &'static str, error: &io::Error) {
        crate::metrics::accept_errors(self.port, reason).increment(1);
        self.unreported += 1;
        let now = Instant::now();
        if self
            .warned_at
            .is_none_or(|at| now.duration_since(at) >= WARNING_INTERVAL)
        {
            tracing::warn!(
                port = self.port,
                %error,
                failures = self.unreported,
                retry_in = ?self.backoff,
                "cannot accept connections; backing off (at the file-descriptor limit: raise `ulimit -n`, or \
                 look for clients holding many connections)"
            );
            self.unreported = 0;
            self.warned_at = Some(now);
        }
        self.sleep = Some(Box::pin(tokio::time::sleep(self.backoff)));
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }
}

/// The metric label of an accept error caused by the process or system running out of something, which
/// retrying at once cannot cure; `None` for an error that concerns only the connection being accepted (it
/// was aborted, or Linux reports a pending network error on it), after which the next one may be fine.
fn resource_shortage(error: &io::Error) -> Option<&'static str> {
    match error.raw_os_error() {
        Some(libc::EMFILE) => return Some("emfile"),
        Some(libc::ENFILE) => return Some("enfile"),
        Some(libc::ENOBUFS) => return Some("enobufs"),
        Some(libc::ENOMEM) => return Some("enomem"),
        Some(libc::EPROTO | libc::ENOPROTOOPT | libc::EOPNOTSUPP | libc::EHOSTDOWN) => return None,
        _ => {}
    }
    use io::ErrorKind::*;
    match error.kind() {
        ConnectionAborted | ConnectionReset | Interrupted | WouldBlock | TimedOut | NetworkDown
        | NetworkUnreachable | HostUnreachable | PermissionDenied => None,
        // Unknown: backing off costs at most a few milliseconds, spinning costs a core.
        _ => Some("other"),
    }
}

/// How an accepted TCP stream becomes the stream HTTP/2 runs on.
pub trait Setup: Clone + Unpin + Send + Sync + 'static {
    /// The stream HTTP/2 runs on.
    type Io: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static;

    /// Sets the stream up (a TLS handshake, or nothing).
    fn setup(&self, tcp: TcpStream) -> impl Future<Output = io::Result<Self::Io>> + Send;
}

/// Plaintext: HTTP/2 runs on the TCP stream itself.
#[derive(Debug, Clone, Copy)]
pub struct Plaintext;

impl Setup for Plaintext {
    type Io = TcpStream;

    async fn setup(&self, tcp: TcpStream) -> io::Result<TcpStream> {
        Ok(tcp)
    }
}

impl Setup for tokio_rustls::TlsAcceptor {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;

    fn setup(&self, tcp: TcpStream) -> impl Future<Output = io::Result<Self::Io>> + Send {
        self.accept(tcp)
    }
}

/// The gRPC port's connections for tonic: accepted with [`Acceptor`], with Nagle's algorithm off, and handed
/// over once set up and past the HTTP/2 preface, each within `handshake_timeout` of being accepted.
///
/// Nagle's algorithm is off because a response's last frames (its trailers) are small writes that Nagle holds
/// back until the client acknowledges the previous segment, which a client delaying its acknowledgements
/// does only after ~40 ms — the latency of every large call otherwise.
///
/// Connections still in their handshake live in a task set owned by the stream, so when tonic drops the
/// stream at shutdown they are closed with the listener.
pub struct Incoming<S: Setup> {
    acceptor: Acceptor,
    setup: S,
    handshake_timeout: Duration,
    handshakes: JoinSet<Option<Connection<S::Io>>>,
}

impl<S: Setup> Incoming<S> {
    /// Serves connections from `listener`, set up by `setup`.
    pub fn new(listener: TcpListener, setup: S, handshake_timeout: Duration) -> Self {
        Self {
            acceptor: Acceptor::new(listener, "grpc"),
            setup,
            handshake_timeout,
            handshakes: JoinSet::new(),
        }
    }
}

impl<S: Setup> Stream for Incoming<S> {
    type Item = Result<Connection<S::Io>, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            // Polled first, so its waker is registered whenever the accept below is pending.
            if let Poll::Ready(Some(done)) = this.handshakes.poll_join_next(cx) {
                match done {
                    Ok(Some(connection)) => return Poll::Ready(Some(Ok(connection))),
                    Ok(None) => {}
                    Err(error) => tracing::error!(%error, "a connection handshake task failed"),
                }
                continue;
            }
            let tcp = ready!(this.acceptor.poll_accept(cx));
            if let Err(error) = tcp.set_nodelay(true) {
                tracing::debug!(%error, "cannot set TCP_NODELAY");
            }
            this.handshakes
                .spawn(handshake(this.setup.clone(), tcp, this.handshake_timeout));
        }
    }
}

/// Sets `tcp` up and reads its HTTP/2 preface within `timeout`; `None` (the connection closed, and counted)
/// if either fails or takes longer.
async fn handshake<S: Setup>(
    setup: S,
    tcp: TcpStream,
    timeout: Duration,
) -> Option<Connection<S::Io>> {
    let peer = tcp.peer_addr().ok();
    let handshake = async {
        let mut io = setup.setup(tcp).await.map_err(|e| ("tls", e))?;
        let mut preface = [0; PREFACE_LEN];
        io.read_exact(&mut preface)
            .await
            .map_err(|e| ("error", e))?;
        Ok(Connection {
            preface,
            replayed: 0,
            io,
        })
    };
    let failure = match tokio::time::timeout(timeout, handshake).await {
        Ok(Ok(connection)) => return Some(connection),
        Ok(Err((stage, error))) => {
            use io::ErrorKind::*;
            let closed = matches!(
                error.kind(),
                UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe
            );
            let reason = if closed { "closed" } else { stage };
            tracing::debug!(?peer, %error, reason, "connection ended before its HTTP/2 preface");
            reason
        }
        Err(_) => {
            tracing::debug!(
                ?peer,
                ?timeout,
                "closing a connection that sent no HTTP/2 preface in time"
            );
            "timeout"
        }
    };
    crate::metrics::failed_handshakes(failure).increment(1);
    None
}

/// A connection past its handshake: the preface read to check it arrived in time is replayed to hyper, which
/// reads it again.
#[derive(Debug)]
pub struct Connection<IO> {
    preface: [u8; PREFACE_LEN],
    replayed: usize,
    io: IO,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Connection<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.replayed < PREFACE_LEN {
            let rest = &this.preface[this.replayed..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.replayed += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Connection<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Forwarded, so handlers see the same connection info (peer address, client certificates) as with tonic's
/// own listener and TLS.
impl<IO: Connected> Connected for Connection<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_out_of_descriptors_backs_off_and_an_aborted_connection_does_not() {
        let os = io::Error::from_raw_os_error;
        assert_eq!(resource_shortage(&os(libc::EMFILE)), Some("emfile"));
        assert_eq!(resource_shortage(&os(libc::ENFILE)), Some("enfile"));
        assert_eq!(resource_shortage(&os(libc::ENOBUFS)), Some("enobufs"));
        assert_eq!(resource_shortage(&os(libc::ENOMEM)), Some("enomem"));
        assert_eq!(resource_shortage(&os(libc::ECONNABORTED)), None);
        assert_eq!(resource_shortage(&os(libc::EPROTO)), None);
        assert_eq!(resource_shortage(&os(libc::EINTR)), None);
        assert_eq!(resource_shortage(&os(libc::EBADF)), Some("other"));
    }

    #[tokio::test]
    async fn the_preface_is_replayed_before_the_rest() {
        let (client, server) = tokio::io::duplex(64);
        let mut connection = Connection {
            preface: *b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            replayed: 0,
            io: server,
        };
        let mut client = client;
        tokio::io::AsyncWriteExt::write_all(&mut client, b"rest")
            .await
            .unwrap();
        drop(client);
        let mut all = Vec::new();
        connection.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\nrest");
    }

    #[tokio::test]
    async fn backoff_doubles_up_to_a_second() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut acceptor = Acceptor::new(listener, "test");
        let error = io::Error::from_raw_os_error(libc::EMFILE);
        let mut waits = Vec::new();
        for _ in 0..10 {
            waits.push(acceptor.backoff);
            acceptor.back_off("emfile", &error);
        }
        assert_eq!(waits[0], Duration::from_millis(5));
        assert_eq!(waits[1], Duration::from_millis(10));
        assert_eq!(*waits.last().unwrap(), MAX_BACKOFF);
    }
}
