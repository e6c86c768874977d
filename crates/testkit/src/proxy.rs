//! A small TCP proxy on a free loopback port in front of one address: the faults a network makes, on demand.
//! `Pass` forwards bytes as they come; `Delay(d)` forwards each chunk `d` after it arrived (order kept,
//! throughput not); `Silent` holds every byte in both directions with the connections left open (a partition
//! that TCP outlasts: what is held flows once the link passes again) — but a side that closes its end has
//! its close passed on once nothing it sent is held, where a real partition would hold the FIN as well
//! (no test relies on either); `Cut` closes every connection and each
//! new one at once. It also keeps what it has written upstream, so a test can wait until a request is in
//! the server's socket (even a stopped server's) instead of hoping it got there.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What the link does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Delay(Duration),
    Silent,
    Cut,
}

/// A proxy, running until dropped.
pub struct Proxy {
    /// Where it listens.
    pub addr: SocketAddr,
    mode: Arc<watch::Sender<Mode>>,
    /// Every byte written to the upstream so far, all connections in order of writing.
    upstream: Arc<Mutex<Vec<u8>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// A proxy in front of `upstream`, passing bytes.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(watch::Sender::new(Mode::Pass));
        let written = Arc::new(Mutex::new(Vec::new()));
        let accept = tokio::spawn(accept(
            listener,
            upstream,
            Arc::clone(&mode),
            Arc::clone(&written),
        ));
        Self {
            addr,
            mode,
            upstream: written,
            accept,
        }
    }

    /// Whether `needle` is among the bytes written to the upstream (handed to its socket) so far.
    pub fn wrote_upstream(&self, needle: &[u8]) -> bool {
        let written = self.upstream.lock().unwrap();
        written.windows(needle.len()).any(|window| window == needle)
    }

    /// Sets what the link does from now on.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// `nats://` URL of the proxy.
    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.mode.send_replace(Mode::Cut);
        self.accept.abort();
    }
}

async fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    mode: Arc<watch::Sender<Mode>>,
    written: Arc<Mutex<Vec<u8>>>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            return;
        };
        if *mode.borrow() == Mode::Cut {
            continue;
        }
        let Ok(server) = TcpStream::connect(upstream).await else {
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        tokio::spawn(pump(
            client_read,
            server_write,
            mode.subscribe(),
            Some(Arc::clone(&written)),
        ));
        tokio::spawn(pump(server_read, client_write, mode.subscribe(), None));
    }
}

/// One direction of one connection: a reader stamping chunks as they arrive, a writer releasing them as the
/// mode allows, appending what it wrote to `written` if given. Ends (closing its half) when either side
/// closes or the link is cut.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mode: watch::Receiver<Mode>,
    written: Option<Arc<Mutex<Vec<u8>>>>,
) {
    let (chunks, mut held) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut read_mode = mode.clone();
    let reader = async move {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            tokio::select! {
                read = from.read(&mut buffer) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if chunks.send((Instant::now(), buffer[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                },
                _ = read_mode.wait_for(|m| *m == Mode::Cut) => return,
            }
        }
    };
    let mut write_mode = mode;
    let writer = async move {
        while let Some((arrived, chunk)) = held.recv().await {
            let released = write_mode
                .wait_for(|m| *m != Mode::Silent)
                .await
                .map(|m| *m);
            match released {
                Ok(Mode::Cut) | Err(_) => return,
                Ok(Mode::Delay(delay)) => tokio::time::sleep_until(arrived + delay).await,
                Ok(_) => {}
            }
            if *write_mode.borrow() == Mode::Cut || to.write_all(&chunk).await.is_err() {
                return;
            }
            if let Some(written) = &written {
                written.lock().unwrap().extend_from_slice(&chunk);
            }
        }
    };
    // The reader ending (EOF) lets the writer drain what it holds; a cut ends both.
    tokio::join!(reader, writer);
}
