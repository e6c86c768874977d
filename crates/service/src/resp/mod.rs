//! The RESP port: RedisBloom's commands over the Redis protocol, so a service with a Redis client (and any
//! Redis tool) can use the gate by changing an address.
//!
//! - [`request`]: reading requests (arrays of bulk strings, inline commands) within limits.
//! - [`reply`]: writing replies in RESP2 or RESP3.
//! - [`commands`]: the command table (arity, permissions, `COMMAND` docs).
//! - [`session`]: a connection's state and its commands (`AUTH`, `HELLO`, `CLIENT`, `INFO`, dispatch).
//! - [`pipeline`]: a pipeline's runs of `BF.EXISTS` answered as one batch, each reply as if alone.
//! - [`pubsub`]: `SUBSCRIBE`/`UNSUBSCRIBE` and the invalidations pushed, a part at a time.
//! - [`budget`]: one memory budget for every connection's unfinished requests.
//! - [`bloom`]: `BF.*` and the gate's `GATE.*` on namespaces.
//! - [`workers`]: the threads connections are served on, one event loop per core.
//!
//! A connection is served by one task that reads, runs every whole command the read brought (in order),
//! and writes all their replies at once. It reads nothing more until those replies are written, so a
//! client that pipelines without reading its replies stalls itself, not the server's memory: what one
//! connection holds is at most one request (bounded by [`RequestLimits`]) and its replies. The number of
//! connections is capped (`-ERR max number of clients reached`, as Redis says), and one that sends
//! nothing for the idle timeout (unless it is subscribed), or does not take its replies within it, is
//! closed; one that has not authenticated, or has not finished a request, within the handshake timeout is
//! closed too ([`Deadline`]).

pub mod bloom;
pub mod budget;
pub mod commands;
pub mod pipeline;
pub mod pubsub;
pub mod reply;
pub mod request;
pub mod session;
pub mod workers;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use metrics::Counter;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::access::Access;
use crate::core::gate::Gate;
use crate::core::writes::Writes;
use crate::listener::Acceptor;
use budget::{Budget, Held};
use commands::{Spec, COMMANDS};
use pubsub::{Push, Rendering};
pub use request::RequestLimits;
use request::{take_command_resuming, Partial, ProtocolError};
use session::Session;
pub use workers::Workers;

/// How the RESP port is served.
#[derive(Debug, Clone)]
pub struct RespOptions {
    /// Where it listens (`existence-gate serve --resp-listen`, default `127.0.0.1:6380`).
    pub listen: SocketAddr,
    /// Connections open at once; more are told `-ERR max number of clients reached` and closed.
    pub max_connections: usize,
    /// A connection that sends nothing, or does not read its replies, for this long is closed (a subscriber
    /// waiting for pushes is not).
    pub idle_timeout: Duration,
    /// Bytes of unfinished requests held across connections beyond each one's free share ([`budget`]).
    pub request_memory: usize,
    /// Threads connections are served on ([`workers`]); 0 = one per core.
    pub threads: usize,
}

impl RespOptions {
    /// The defaults of `existence-gate serve` on `listen`.
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            max_connections: 1_024,
            idle_timeout: Duration::from_secs(300),
            request_memory: 256 << 20,
            threads: 0,
        }
    }
}

/// Pushes queued per connection before its subscriptions wait (a subscriber that falls further behind the
/// namespace's replay buffer is sent `resync`, as gRPC subscribers are). Each holds its invalidation alive
/// past the replay buffer: with 64, 50 subscribers that did not read took the gate from 26 to 167 MB
/// during 100 `BF.MADD`s of 1,000 1 KB keys; with 4 (and pushes written a part at a time, [`pubsub`]),
/// 24 to 61 MB, the same after 300. The forwarder refills the queue as soon as the connection takes one.
const PUSH_QUEUE: usize = 4;
/// Commands run per read at most, so that one read of many tiny commands cannot hold replies back
/// without bound (the rest stay in the buffer for the next round).
const MAX_PIPELINE: usize = 4_096;
/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 16 * 1024;

/// What every connection of the port shares.
#[derive(Debug)]
pub struct Port {
    gate: Arc<Gate>,
    writes: Arc<dyn Writes>,
    access: Arc<Access>,
    limits: RequestLimits,
    options: RespOptions,
    budget: Arc<Budget>,
    next_id: AtomicU64,
    open: AtomicUsize,
    metrics: CommandMetrics,
}

impl Port {
    /// Most keys one `Add` may carry: a pipelined run of `BF.ADD`s sent as one stays within it.
    fn max_batch_keys(&self) -> usize {
        self.gate.limits().max_batch_keys
    }

    /// The port for `gate`, its writes going to `writes`, behind `access`; requests bounded by the gate's
    /// limits (a key's length, a batch's keys).
    pub fn new(
        gate: Arc<Gate>,
        writes: Arc<dyn Writes>,
        access: Arc<Access>,
        options: RespOptions,
    ) -> Arc<Self> {
        let limits = gate.limits();
        let limits = RequestLimits {
            // The name, the namespace and BF.INSERT's options besides the keys.
            max_args: limits.max_batch_keys + 16,
            max_arg_bytes: limits.max_key_bytes.max(4_096),
            max_inline_bytes: 64 * 1024,
            unauthenticated: false,
        };
        Arc::new(Self {
            gate,
            writes,
            access,
            limits,
            budget: Budget::new(options.request_memory),
            options,
            next_id: AtomicU64::new(1),
            open: AtomicUsize::new(0),
            metrics: CommandMetrics::new(),
        })
    }

    /// The shutdown signal its connections watch.
    pub fn shutdown(&self) -> &crate::shutdown::Shutdown {
        self.access.shutdown()
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Bytes of the unfinished-request budget held by connections now ([`budget`]).
    pub fn request_memory_held(&self) -> usize {
        self.budget.held()
    }
}

/// How an accepted TCP stream becomes the byte stream RESP runs on: itself, or TLS over it.
pub trait Transport: Clone + Send + Sync + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn setup(
        &self,
        tcp: TcpStream,
    ) -> impl std::future::Future<Output = std::io::Result<Self::Io>> + Send;
}

impl Transport for crate::listener::Plaintext {
    type Io = TcpStream;
    async fn setup(&self, tcp: TcpStream) -> std::io::Result<TcpStream> {
        Ok(tcp)
    }
}

impl Transport for tokio_rustls::TlsAcceptor {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    async fn setup(&self, tcp: TcpStream) -> std::io::Result<Self::Io> {
        self.accept(tcp).await
    }
}

/// Accepts connections on `listener` until shutdown, each set up by `transport` within `handshake_timeout`
/// and then served on one of `workers`; then waits until its connections have closed.
pub async fn serve<T: Transport>(
    port: Arc<Port>,
    listener: TcpListener,
    transport: T,
    handshake_timeout: Duration,
    workers: Workers,
) {
    let mut acceptor = Acceptor::new(listener, "resp");
    let shutdown = port.access.shutdown().clone();
    loop {
        let tcp = tokio::select! {
            () = shutdown.wait() => break,
            tcp = acceptor.accept() => tcp,
        };
        let _ = tcp.set_nodelay(true);
        let port = Arc::clone(&port);
        let transport = transport.clone();
        workers.spawn(tcp, move |tcp| async move {
            let Some(guard) = Open::claim(&port) else {
                refuse(tcp).await;
                return;
            };
            let connected = tokio::time::Instant::now();
            match tokio::time::timeout(handshake_timeout, transport.setup(tcp)).await {
                Ok(Ok(io)) => {
                    serve_connection(&port, io, connected + handshake_timeout, handshake_timeout)
                        .await
                }
                Ok(Err(error)) => {
                    tracing::debug!(%error, "RESP connection failed its TLS handshake")
                }
                Err(_) => tracing::debug!(
                    ?handshake_timeout,
                    "RESP connection's TLS handshake timed out"
                ),
            }
            drop(guard);
        });
    }
    // New connections are refused from here; the open ones close ([`close_at_shutdown`]).
    drop(acceptor);
    workers.finish().await;
}

/// Serves one connection over any byte stream `io` until it ends, as [`serve`] serves each it accepts (the
/// count of open connections aside): authentication and every request due within `handshake_timeout`. For
/// connections made in-process — the fuzz target of the whole session, tests.
pub async fn serve_io(
    port: &Arc<Port>,
    io: impl AsyncRead + AsyncWrite + Unpin,
    handshake_timeout: Duration,
) {
    let connected = tokio::time::Instant::now();
    serve_connection(port, io, connected + handshake_timeout, handshake_timeout).await
}

/// One open connection's place in the count.
struct Open<'a>(&'a Port);

impl<'a> Open<'a> {
    fn claim(port: &'a Port) -> Option<Self> {
        let max = port.options.max_connections;
        port.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Self(port))
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection past the limit: told so (in plaintext, as Redis does before any handshake) and closed.
async fn refuse(mut tcp: TcpStream) {
    crate::metrics::resp_refused_connections().increment(1);
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        tcp.write_all(b"-ERR max number of clients reached\r\n"),
    )
    .await;
}

/// Serves one connection until the peer closes it, `QUIT`, a protocol error, the idle timeout, a deadline
/// or shutdown ([`close_at_shutdown`]).
///
/// The loop is the per-command cost of an unpipelined client, so it arms nothing per round: the idle timer
/// is one sleep, pushed back lazily when it fires early (a per-read `timeout` inserted and removed a timer
/// on every command), and the shutdown wait is one future (a fresh `wait()` per read cloned the shutdown
/// channel's receiver and registered on its waiter list, shared by every connection). Deadlines are armed
/// only while they can fire ([`Deadline`]): before `AUTH`, and while a request is unfinished.
async fn serve_connection(
    port: &Arc<Port>,
    mut io: impl AsyncRead + AsyncWrite + Unpin,
    auth_by: tokio::time::Instant,
    request_within: Duration,
) {
    let (pushes_tx, mut pushes) = mpsc::channel::<Push>(PUSH_QUEUE);
    let mut session = Session::new(Arc::clone(port), pushes_tx);
    let mut input = BytesMut::with_capacity(READ_CHUNK);
    let mut output = BytesMut::with_capacity(READ_CHUNK);
    let shutdown = port.access.shutdown().clone();
    let mut shutdown = std::pin::pin!(shutdown.wait());
    let mut idle = Idle::new(port.options.idle_timeout);
    let mut unfinished_since = None;
    let mut partial = Partial::default();
    let mut held = Held::new(Arc::clone(&port.budget));
    // A push being written out, a part at a time ([`pubsub`]).
    let mut rendering: Option<Rendering> = None;
    loop {
        if let Some(push) = &mut rendering {
            if session.write_push(push, &mut output) {
                rendering = None;
            }
        }
        // Before AUTH, one command at a time: the commands after an `AUTH` in the same read are read with
        // the limits it lifts.
        let (limits, most) = if session.awaiting_auth() {
            (port.limits.before_auth(), 1)
        } else {
            (port.limits, MAX_PIPELINE)
        };
        let commands = match take_commands(&mut input, &mut partial, &limits, most) {
            Ok(commands) => commands,
            Err(ProtocolError(message)) => {
                session.replies(&mut output).error("ERR", &message);
                release(&mut input, &mut held);
                close_after(&mut io, &output).await;
                return;
            }
        };
        if !commands.is_empty() {
            session.run(&commands, &mut output).await;
            shrink(&mut input, &mut held);
        }
        if !output.is_empty() {
            let mut write = std::pin::pin!(io.write_all(&output));
            loop {
                tokio::select! {
                    biased;
                    written = &mut write => match written {
                        Ok(()) => break,
                        Err(_) => return,
                    },
                    expired = idle.expired() => if expired {
                        tracing::debug!(timeout = ?idle.timeout, "closing a RESP connection that does not read its replies");
                        return;
                    },
                }
            }
            output.clear();
            idle.active();
        }
        if session.closing {
            return;
        }
        if rendering.is_some() {
            continue; // the push's next part, once this one is written
        }
        if !commands.is_empty() {
            // A request was finished: what is left starts the next one, whose time starts when it is seen
            // unfinished (a pipelining client's reads end mid-request all the time). More may be buffered
            // already (more than one round's worth of commands arrived at once).
            unfinished_since = None;
            continue;
        }
        // Whatever is left in the input is the start of a request not read whole yet.
        if input.is_empty() {
            unfinished_since = None;
        } else if unfinished_since.is_none() {
            unfinished_since = Some(tokio::time::Instant::now());
        }
        let deadline = Deadline::next(
            session.awaiting_auth().then_some(auth_by),
            unfinished_since.map(|since| since + request_within),
        );
        input.reserve(READ_CHUNK);
        if !held.cover(input.capacity()) {
            crate::metrics::resp_budget_closes().increment(1);
            let message = over_budget(port.budget.total(), input.len());
            session.replies(&mut output).error("ERR", &message);
            release(&mut input, &mut held);
            close_after(&mut io, &output).await;
            return;
        }
        let subscribed = session.is_subscribed();
        tokio::select! {
            biased;
            read = io.read_buf(&mut input) => match read {
                Ok(0) | Err(_) => return,
                Ok(_) => idle.active(),
            },
            Some(push) = pushes.recv(), if subscribed => rendering = Some(Rendering::new(push)),
            // A subscriber waits for pushes, however quiet its namespaces: as Redis does, the idle
            // timeout spares it (one that does not read its pushes is closed above, by the same timeout).
            expired = idle.expired(), if !subscribed => if expired {
                tracing::debug!(timeout = ?idle.timeout, "closing an idle RESP connection");
                return;
            },
            missed = deadline.passed() => {
                crate::metrics::resp_deadline_closes(missed.reason()).increment(1);
                session.replies(&mut output).error(missed.kind(), &missed.message(request_within));
                release(&mut input, &mut held);
                close_after(&mut io, &output).await;
                return;
            },
            () = &mut shutdown => {
                close_at_shutdown(&mut io, &input, &mut session, &mut output).await;
                return;
            }
        }
    }
}

/// Closes a connection at shutdown (the drain delay over: balancers had time to send new connections
/// elsewhere). A client that has begun a request waits for a reply, so it gets the retryable one every
/// command read from now on gets (`TRYAGAIN`), rather than a connection closed under it; an idle one is
/// closed with a FIN (its next command reconnects, through the balancer, to another replica). Both linger
/// reading, so that bytes already on their way meet no reset. A request has begun too when its first bytes
/// have arrived but were not read yet (the connection's task had not run since): one read that does not
/// wait looks.
async fn close_at_shutdown(
    io: &mut (impl AsyncRead + AsyncWrite + Unpin),
    input: &BytesMut,
    session: &mut Session,
    output: &mut BytesMut,
) {
    let mut arrived = [0u8; 1];
    let begun = !input.is_empty()
        || matches!(
            tokio::time::timeout(Duration::ZERO, io.read(&mut arrived)).await,
            Ok(Ok(n)) if n > 0
        );
    if begun {
        session
            .replies(output)
            .error("TRYAGAIN", crate::access::SHUTTING_DOWN);
    }
    close_after(io, output).await;
}

/// Lets a buffer that held a large request go, once what is left of it is small, and gives the budget
/// back: a buffer keeps its capacity after the request is taken from it.
fn shrink(input: &mut BytesMut, held: &mut Held) {
    if input.capacity() > budget::FREE_BYTES && input.len() < input.capacity() / 4 {
        *input = BytesMut::from(&input[..]);
        held.cover(input.capacity());
    }
}

/// Gives back a closing connection's input buffer and its share of the budget before it lingers
/// ([`close_after`], up to [`LINGER`]): the request it held will never be served, and another connection's
/// may need the bytes now. (Held through the linger, a refused request's share refused the next large
/// request for a second more, though nothing would ever use it.)
fn release(input: &mut BytesMut, held: &mut Held) {
    *input = BytesMut::new();
    held.cover(0);
}

/// Why a connection whose unfinished request outgrew the port's budget is closed.
fn over_budget(total: usize, holding: usize) -> String {
    format!(
        "the RESP port's memory for unfinished requests ({} MiB beyond 64 KiB a connection, \
         --resp-request-memory-mib) is taken by other connections: this request ({holding} bytes so far) is \
         refused and the connection closed; retry, or send smaller requests",
        total >> 20
    )
}

/// The deadline a connection must meet next, if any: to authenticate (where tokens are configured) within
/// `handshake_timeout` of connecting, and to finish a request within `handshake_timeout` of its first
/// byte. The idle timeout alone let a client holding one unfinished request, a byte a second, keep its
/// connection (and its place in `max_connections`) for ever: 50 such connections, none authenticated,
/// refused every new client past four idle timeouts.
enum Deadline {
    None,
    Auth(tokio::time::Instant),
    Request(tokio::time::Instant),
}

impl Deadline {
    fn next(auth: Option<tokio::time::Instant>, request: Option<tokio::time::Instant>) -> Self {
        match (auth, request) {
            (Some(auth), Some(request)) if request < auth => Self::Request(request),
            (Some(auth), _) => Self::Auth(auth),
            (None, Some(request)) => Self::Request(request),
            (None, None) => Self::None,
        }
    }

    /// Completes when the deadline passes; never if there is none.
    async fn passed(&self) -> &Self {
        match self {
            Self::None => std::future::pending().await,
            Self::Auth(at) | Self::Request(at) => tokio::time::sleep_until(*at).await,
        }
        self
    }

    fn reason(&self) -> &'static str {
        match self {
            Self::Auth(_) => "auth",
            _ => "request",
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Self::Auth(_) => "NOAUTH",
            _ => "ERR",
        }
    }

    fn message(&self, within: Duration) -> String {
        match self {
            Self::Auth(_) => format!(
                "Authentication required: a connection must AUTH within {within:?} (handshake_timeout); \
                 closing"
            ),
            _ => format!(
                "Protocol error: a request not finished within {within:?} of its first byte \
                 (handshake_timeout); closing"
            ),
        }
    }
}

/// A connection's idle timer: one sleep for the connection's life, which only moves when it fires before
/// the connection has been idle for the whole timeout.
struct Idle {
    timeout: Duration,
    active_at: tokio::time::Instant,
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl Idle {
    fn new(timeout: Duration) -> Self {
        let now = tokio::time::Instant::now();
        Self {
            timeout,
            active_at: now,
            sleep: Box::pin(tokio::time::sleep_until(now + timeout)),
        }
    }

    /// The connection did something now.
    fn active(&mut self) {
        self.active_at = tokio::time::Instant::now();
    }

    /// Completes when the sleep fires: `true` if the connection has been idle for the timeout, else `false`
    /// (the sleep moved to when it would be).
    async fn expired(&mut self) -> bool {
        self.sleep.as_mut().await;
        let due = self.active_at + self.timeout;
        if tokio::time::Instant::now() >= due {
            return true;
        }
        self.sleep.as_mut().reset(due);
        false
    }
}

/// How long, and how many unread bytes, a connection closed for a protocol error is drained for.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 1 << 20;

/// Writes `last` and closes the connection so that the peer reads it: the write side is shut first (FIN),
/// then what the peer still sends is read and dropped for a moment, since closing a socket with unread
/// input sends a reset, which can destroy the reply before the peer reads it.
async fn close_after(io: &mut (impl AsyncRead + AsyncWrite + Unpin), last: &[u8]) {
    let _ = tokio::time::timeout(LINGER, async {
        io.write_all(last).await?;
        io.shutdown().await?;
        let mut sink = [0u8; 8192];
        let mut drained = 0;
        while drained < LINGER_BYTES {
            match io.read(&mut sink).await? {
                0 => break,
                n => drained += n,
            }
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
}

/// Every whole command at the front of `input`, up to `most`, resuming the one `partial` was reading.
fn take_commands(
    input: &mut BytesMut,
    partial: &mut Partial,
    limits: &RequestLimits,
    most: usize,
) -> Result<Vec<Vec<bytes::Bytes>>, ProtocolError> {
    let mut commands = Vec::new();
    while commands.len() < most {
        match take_command_resuming(input, limits, partial)? {
            Some(command) => commands.push(command),
            None => break,
        }
    }
    Ok(commands)
}

/// Commands by name and outcome (`existence_resp_commands_total`), the handles resolved once.
#[derive(Debug)]
struct CommandMetrics {
    /// Per command of [`COMMANDS`], in its order: (ok, error).
    counters: Vec<(Counter, Counter)>,
}

impl CommandMetrics {
    fn new() -> Self {
        Self {
            counters: COMMANDS
                .iter()
                .map(|spec| {
                    (
                        crate::metrics::resp_commands(spec.name, "ok"),
                        crate::metrics::resp_commands(spec.name, "error"),
                    )
                })
                .collect(),
        }
    }

    /// Counts `count` runs of `spec` that succeeded or not.
    fn record(&self, spec: &Spec, count: u64, ok: bool) {
        let index = COMMANDS
            .iter()
            .position(|s| s.name == spec.name)
            .expect("specs come from the table");
        let (succeeded, failed) = &self.counters[index];
        if ok { succeeded } else { failed }.increment(count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Authorizer;
    use crate::core::clock::SystemClock;
    use crate::core::config::GateConfig;
    use crate::core::hashing::KeyHasher;
    use crate::core::log::VolatileLog;
    use crate::shutdown::Shutdown;
    use crate::writes::LocalWrites;

    /// A port with no namespaces or tokens and a budget of `request_memory` bytes.
    fn port(request_memory: usize) -> Arc<Port> {
        let gate = Arc::new(Gate::new(
            &GateConfig::default(),
            KeyHasher::from_seed([1; 32]),
            Arc::new(SystemClock),
        ));
        gate.open(Arc::new(VolatileLog));
        let access = Access::new(Authorizer::new(&[]).unwrap(), Shutdown::default(), 2);
        let writes: Arc<dyn Writes> = Arc::new(LocalWrites::new(Arc::clone(&gate)));
        let mut options = RespOptions::new(([127, 0, 0, 1], 0).into());
        options.request_memory = request_memory;
        Port::new(gate, writes, access, options)
    }

    /// A request refused for outgrowing the budget gives the budget back by the time its refusal arrives,
    /// while the connection still lingers (the peer has not closed, and time stands still): nothing held
    /// for a request that will never be served.
    #[tokio::test(start_paused = true)]
    async fn a_refused_request_gives_its_budget_back_before_the_connection_lingers() {
        let port = port(budget::FREE_BYTES);
        let (client, server) = tokio::io::duplex(budget::FREE_BYTES);
        let serving = Arc::clone(&port);
        let served = tokio::spawn(async move {
            serve_io(&serving, server, Duration::from_secs(30)).await;
        });
        let (mut from_server, mut to_server) = tokio::io::split(client);
        let keys = 2_000;
        let request = [
            format!("*{}\r\n$7\r\nBF.MADD\r\n$5\r\nusers\r\n", keys + 2).into_bytes(),
            (0..keys - 1)
                .flat_map(|i| format!("$100\r\n{i:0>100}\r\n").into_bytes())
                .collect(),
        ]
        .concat();
        let writing = tokio::spawn(async move {
            let _ = to_server.write_all(&request).await;
            to_server // kept open: the connection lingers until the peer closes or LINGER passes
        });
        let mut reply = Vec::new();
        while !reply.ends_with(b"\r\n") {
            let mut chunk = [0u8; 512];
            let n = from_server.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed before a whole refusal");
            reply.extend_from_slice(&chunk[..n]);
        }
        let reply = String::from_utf8_lossy(&reply);
        assert!(
            reply.starts_with("-ERR the RESP port's memory for unfinished requests"),
            "{reply}"
        );
        assert_eq!(port.request_memory_held(), 0, "held while lingering");
        assert!(!served.is_finished(), "the connection still lingers");
        drop(writing.await.unwrap());
        served.await.unwrap();
        assert_eq!(port.request_memory_held(), 0);
    }
}
