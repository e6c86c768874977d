//! The feed's HTTP port: `/metrics` (Prometheus), `/healthz` (the process is up), `/readyz` (following the
//! slot: 200; otherwise 503 with the reason, e.g. disconnected from PostgreSQL).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::service::listener::Acceptor;
use crate::service::shutdown::Shutdown;

/// How long a connection may take to send a request head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether the feed follows its slot, and why not.
#[derive(Debug)]
pub struct Health {
    not_ready: Mutex<Option<String>>,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            not_ready: Mutex::new(Some("starting".to_string())),
        }
    }
}

impl Health {
    /// Following the slot.
    pub fn ready(&self) {
        *self.not_ready.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Not following it, because of `reason`.
    pub fn not_ready(&self, reason: String) {
        *self.not_ready.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
    }

    fn reason(&self) -> Option<String> {
        self.not_ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[derive(Clone)]
struct Http {
    prometheus: PrometheusHandle,
    health: Arc<Health>,
}

/// Binds `listen` and serves the port in the background (aborting the handle stops it).
pub async fn serve(
    listen: SocketAddr,
    prometheus: PrometheusHandle,
    health: Arc<Health>,
) -> Result<tokio::task::JoinHandle<()>, String> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on --http-listen {listen}: {e}"))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(http_addr = %address, "feed serving /metrics, /healthz, /readyz");
    let router = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(Http { prometheus, health });
    Ok(tokio::spawn(crate::service::http::serve(
        Acceptor::new(listener, "http"),
        router,
        HEADER_TIMEOUT,
        Shutdown::default(),
    )))
}

async fn metrics(State(http): State<Http>) -> String {
    http.prometheus.render()
}

async fn readyz(State(http): State<Http>) -> (StatusCode, String) {
    match http.health.reason() {
        None => (StatusCode::OK, "ready\n".to_string()),
        Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    }
}
