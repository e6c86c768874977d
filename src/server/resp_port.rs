//! The RESP port: the service's [`resp`](crate::service::resp) served on its listener until shutdown,
//! plaintext or with the gRPC port's TLS (`rediss://`, mutual TLS included).

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::{RespOptions, ServeOptions, ServerError};
use crate::service::listener::Plaintext;
use crate::service::resp::{self, Port, Workers};

/// Serves `port` on `listener`, with TLS when the gRPC port has it.
pub(super) fn serve(
    options: &ServeOptions,
    resp: &RespOptions,
    port: Arc<Port>,
    listener: TcpListener,
) -> Result<JoinHandle<()>, ServerError> {
    let handshake_timeout = options.config.limits.handshake_timeout;
    let threads = match resp.threads {
        0 => std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
        threads => threads,
    };
    let workers = Workers::start(threads, port.shutdown()).map_err(|e| {
        ServerError::Config(format!(
            "cannot start the RESP port's {threads} threads: {e}"
        ))
    })?;
    tracing::info!(
        listen = %resp.listen,
        max_connections = resp.max_connections,
        idle_timeout = ?resp.idle_timeout,
        tls = options.tls.is_some(),
        threads,
        "RESP port"
    );
    Ok(match &options.tls {
        None => tokio::spawn(resp::serve(
            port,
            listener,
            Plaintext,
            handshake_timeout,
            workers,
        )),
        Some(tls) => {
            let acceptor = tls.resp_acceptor()?;
            tokio::spawn(resp::serve(
                port,
                listener,
                acceptor,
                handshake_timeout,
                workers,
            ))
        }
    })
}
