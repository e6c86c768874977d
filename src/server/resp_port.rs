//! The RESP port: the service's [`resp`](crate::service::resp) served on its listener until shutdown,
//! plaintext or with the gRPC port's TLS (`rediss://`, mutual TLS included).

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::{RespOptions, ServeOptions, ServerError};
use crate::service::listener::Plaintext;
use crate::service::resp::{self, Port};

/// Serves `port` on `listener`, with TLS when the gRPC port has it.
pub(super) fn serve(
    options: &ServeOptions,
    resp: &RespOptions,
    port: Arc<Port>,
    listener: TcpListener,
) -> Result<JoinHandle<()>, ServerError> {
    let handshake_timeout = options.config.limits.handshake_timeout;
    tracing::info!(
        listen = %resp.listen,
        max_connections = resp.max_connections,
        idle_timeout = ?resp.idle_timeout,
        tls = options.tls.is_some(),
        "RESP port"
    );
    Ok(match &options.tls {
        None => tokio::spawn(resp::serve(port, listener, Plaintext, handshake_timeout)),
        Some(tls) => {
            let acceptor = tls.resp_acceptor()?;
            tokio::spawn(resp::serve(port, listener, acceptor, handshake_timeout))
        }
    })
}
