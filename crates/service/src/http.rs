//! The HTTP side port: Prometheus `/metrics`, and `/healthz` (the process is up) and `/readyz` (it answers
//! from loaded state and is not shutting down) for HTTP-only load balancers and orchestrators.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::core::gate::Gate;
use crate::lifecycle::{Lifecycle, Phase};
use crate::listener::Acceptor;
use crate::memory::Memory;
use crate::shutdown::Shutdown;

/// What the handlers read.
#[derive(Clone)]
struct Http {
    gate: Arc<Gate>,
    prometheus: PrometheusHandle,
    lifecycle: Arc<Lifecycle>,
}

/// The routes of the HTTP port.
pub fn router(gate: Arc<Gate>, prometheus: PrometheusHandle, lifecycle: Arc<Lifecycle>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(Http {
            gate,
            prometheus,
            lifecycle,
        })
}

/// Serves `router` over HTTP/1.1 on connections from `acceptor` until `shutdown`, then stops accepting and lets
/// requests in flight finish.
///
/// hyper itself rather than `axum::serve`, because only with a timer does hyper enforce its header read
/// timeout: a connection must send a request head within `header_timeout` of being accepted or of its
/// previous response, so neither a connection that sends nothing nor an idle keep-alive one holds a
/// descriptor for ever.
pub async fn serve(
    mut acceptor: Acceptor,
    router: Router,
    header_timeout: Duration,
    shutdown: Shutdown,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let tcp = tokio::select! {
            () = shutdown.wait() => break,
            tcp = acceptor.accept() => tcp,
        };
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(tcp), service));
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "HTTP connection ended with an error");
            }
        });
    }
    drop(acceptor);
    graceful.shutdown().await;
}

/// Renders the metrics on the blocking pool: folding the latency samples recorded since the last upkeep
/// and rendering every series take milliseconds under load, which on a request thread would stall the gRPC
/// calls queued behind it.
async fn metrics(State(http): State<Http>) -> (StatusCode, String) {
    let render = tokio::task::spawn_blocking(move || {
        let stats = http.gate.export_gauges();
        crate::metrics::memory(&Memory::measure(&stats));
        http.prometheus.run_upkeep();
        http.prometheus.render()
    });
    match render.await {
        Ok(text) => (StatusCode::OK, text),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("rendering the metrics failed: {e}\n"),
        ),
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(http): State<Http>) -> (StatusCode, String) {
    let unavailable = |why: String| (StatusCode::SERVICE_UNAVAILABLE, why);
    match http.lifecycle.phase() {
        Phase::Loading => unavailable("warming\n".to_string()),
        Phase::Draining => unavailable("shutting down\n".to_string()),
        Phase::Failed(reason) => unavailable(format!("loading failed: {reason}\n")),
        Phase::Ready => match (http.lifecycle.lagging(), http.gate.write_failure()) {
            (Some(reason), _) => unavailable(format!("lagging: {reason}\n")),
            (None, Some(reason)) => unavailable(format!(
                "degraded: lookups are answered, writes are refused: {reason}\n"
            )),
            (None, None) => (StatusCode::OK, "ready\n".to_string()),
        },
    }
}
