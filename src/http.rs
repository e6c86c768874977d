//! The HTTP side port: Prometheus `/metrics`, and `/healthz` (the process is up) and `/readyz` (it answers
//! from loaded state and is not shutting down) for HTTP-only load balancers and orchestrators.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::gate::Gate;
use crate::shutdown::Shutdown;

/// What the handlers read.
#[derive(Clone)]
struct Http {
    gate: Arc<Gate>,
    prometheus: PrometheusHandle,
    shutdown: Shutdown,
}

/// The routes of the HTTP port.
pub fn router(gate: Arc<Gate>, prometheus: PrometheusHandle, shutdown: Shutdown) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(Http {
            gate,
            prometheus,
            shutdown,
        })
}

/// Renders the metrics on the blocking pool: folding the latency samples recorded since the last upkeep
/// and rendering every series take milliseconds under load, which on a request thread would stall the gRPC
/// calls queued behind it.
async fn metrics(State(http): State<Http>) -> (StatusCode, String) {
    let render = tokio::task::spawn_blocking(move || {
        http.gate.export_gauges();
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

async fn readyz(State(http): State<Http>) -> (StatusCode, &'static str) {
    if http.shutdown.is_triggered() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
    } else if !http.gate.is_ready() {
        (StatusCode::SERVICE_UNAVAILABLE, "warming\n")
    } else {
        (StatusCode::OK, "ready\n")
    }
}
