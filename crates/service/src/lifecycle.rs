//! The server's one lifecycle state, which gRPC health, `/readyz`, the admin service and the wiring all read.
//!
//! ```text
//! Loading ──ready──▶ Ready ──shutdown──▶ Draining
//!    └──────fail──▶ Failed (shutdown follows)
//! ```
//!
//! `Loading`: the newest snapshot loads and the log replays; lookups fail open, writes are `UNAVAILABLE`.
//! `Ready`: the gate answers from loaded state and takes writes (see [`Gate::write_failure`] for writes
//! refused while ready). `Draining`: shutdown began (derived from the [`Shutdown`] signal, so every reader sees
//! it the moment it is triggered). `Failed`: loading failed; the server is stopping. Whether the server keeps
//! state at all is fixed at start: [`Lifecycle::persistence`] tells "no data directory" from "not loaded yet".
//!
//! A replica of a shared stream can also be *lagging* while `Ready` (too far behind the stream, or without
//! a read lease): health `NOT_SERVING` and `/readyz` 503 say so, so balancers route around it, while it
//! still answers whoever asks (failing open where it must).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::watch;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::core::gate::Gate;
use crate::core::log::Log;
use crate::shutdown::Shutdown;
use crate::storage::Persistence;

/// Where the server is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// State is loading.
    Loading,
    /// Serving from loaded state.
    Ready,
    /// Loading failed (the reason says how to recover); the server is stopping.
    Failed(String),
    /// Shutdown began.
    Draining,
}

/// Why the durable side of the server cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotDurable {
    /// The server runs without a data directory.
    InMemory,
    /// Its state is still loading (or failed to load).
    NotLoaded,
}

impl std::fmt::Display for NotDurable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::InMemory => "the server runs --in-memory: there is no data directory",
            Self::NotLoaded => "the state is still loading; retry shortly",
        })
    }
}

/// The lifecycle of one server.
#[derive(Debug)]
pub struct Lifecycle {
    loaded: watch::Sender<Phase>,
    shutdown: Shutdown,
    durable: bool,
    persistence: OnceLock<Persistence>,
    /// gRPC health, kept in step: `SERVING` exactly from `ready` until `drain`, except while lagging.
    health: HealthReporter,
    /// Why a ready replica should not take traffic now, if it should not.
    lagging: Mutex<Option<String>>,
    /// Set by [`drain`](Self::drain): the server is leaving, and says so, though it still serves until
    /// shutdown is triggered.
    draining: AtomicBool,
}

/// Health service names this server reports: overall ("") and the contract's.
const HEALTH_NAMES: [&str; 2] = ["", crate::proto::existence_gate_server::SERVICE_NAME];

impl Lifecycle {
    /// A server starting to load (health `NOT_SERVING`); `durable` if it has a data directory.
    pub async fn new(shutdown: Shutdown, durable: bool, health: HealthReporter) -> Arc<Self> {
        let lifecycle = Self {
            loaded: watch::Sender::new(Phase::Loading),
            shutdown,
            durable,
            persistence: OnceLock::new(),
            health,
            lagging: Mutex::new(None),
            draining: AtomicBool::new(false),
        };
        lifecycle.report(ServingStatus::NotServing).await;
        Arc::new(lifecycle)
    }

    async fn report(&self, status: ServingStatus) {
        for name in HEALTH_NAMES {
            self.health.set_service_status(name, status).await;
        }
    }

    /// The phase now.
    pub fn phase(&self) -> Phase {
        let loaded = self.loaded.borrow().clone();
        match loaded {
            Phase::Failed(_) => loaded,
            _ if self.shutdown.is_triggered() || self.draining.load(Ordering::Acquire) => {
                Phase::Draining
            }
            _ => loaded,
        }
    }

    /// Ends loading: the gate answers from its state and writes go to `log`; `persistence` is the durable
    /// side (`None` without a data directory); health turns `SERVING` (unless shutdown began meanwhile).
    /// The only way into `Ready`.
    pub async fn ready(&self, gate: &Gate, log: Arc<dyn Log>, persistence: Option<Persistence>) {
        if let Some(persistence) = persistence {
            let _ = self.persistence.set(persistence);
        }
        gate.open(log);
        self.become_ready().await;
    }

    /// Ends loading for a replica of a shared stream, caught up with it: writes are published.
    pub async fn ready_replica(&self, gate: &Gate, persistence: Option<Persistence>) {
        if let Some(persistence) = persistence {
            let _ = self.persistence.set(persistence);
        }
        gate.open_published();
        self.become_ready().await;
    }

    async fn become_ready(&self) {
        let leaving = self.shutdown.is_triggered() || self.draining.load(Ordering::Acquire);
        if !leaving && self.lagging().is_none() {
            self.report(ServingStatus::Serving).await;
        }
        self.loaded.send_replace(Phase::Ready);
    }

    /// Why the replica should not take traffic now (`None`: it should).
    pub fn lagging(&self) -> Option<String> {
        self.lagging
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records whether the replica lags, turning health `NOT_SERVING` while it does (and back to
    /// `SERVING` when it stops, if ready and not shutting down). Logged when it changes.
    pub async fn set_lagging(&self, reason: Option<String>) {
        let before = std::mem::replace(
            &mut *self.lagging.lock().unwrap_or_else(|e| e.into_inner()),
            reason.clone(),
        );
        if before.is_some() == reason.is_some() {
            return;
        }
        match &reason {
            Some(reason) => tracing::warn!(%reason, "lagging: health NOT_SERVING"),
            None => tracing::info!("caught up: health SERVING"),
        }
        let serving = reason.is_none() && self.phase() == Phase::Ready;
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        self.report(status).await;
    }

    /// Turns health `NOT_SERVING` and `/readyz` 503 for shutdown, for good: balancers stop sending before
    /// the listeners close (calls still arriving are served until shutdown is triggered).
    pub async fn drain(&self) {
        self.draining.store(true, Ordering::Release);
        self.report(ServingStatus::NotServing).await;
    }

    /// Loading failed for `reason`: the server stops.
    pub fn fail(&self, reason: String) {
        tracing::error!("cannot load state: {reason}");
        self.loaded.send_replace(Phase::Failed(reason));
        self.shutdown.trigger();
    }

    /// Waits until loading ends: `Err` with the reason if it failed.
    pub async fn loaded(&self) -> Result<(), String> {
        let mut loaded = self.loaded.subscribe();
        let phase = loaded
            .wait_for(|phase| *phase != Phase::Loading)
            .await
            .map(|phase| phase.clone());
        match phase {
            Ok(Phase::Failed(reason)) => Err(reason),
            Ok(_) => Ok(()),
            Err(_) => Err("the loader vanished".to_string()),
        }
    }

    /// The log and snapshots, once loaded.
    pub fn persistence(&self) -> Result<&Persistence, NotDurable> {
        match self.persistence.get() {
            Some(persistence) => Ok(persistence),
            None if self.durable => Err(NotDurable::NotLoaded),
            None => Err(NotDurable::InMemory),
        }
    }

    /// The shutdown signal.
    pub fn shutdown(&self) -> &Shutdown {
        &self.shutdown
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::clock::SystemClock;
    use crate::core::config::GateConfig;
    use crate::core::hashing::KeyHasher;
    use crate::core::log::VolatileLog;

    async fn lifecycle(shutdown: &Shutdown, durable: bool) -> Arc<Lifecycle> {
        let (health, _) = tonic_health::server::health_reporter();
        Lifecycle::new(shutdown.clone(), durable, health).await
    }

    #[tokio::test]
    async fn one_state_from_loading_to_draining() {
        let shutdown = Shutdown::default();
        let lifecycle = lifecycle(&shutdown, true).await;
        let gate = Gate::new(
            &GateConfig::default(),
            KeyHasher::from_seed([1; 32]),
            Arc::new(SystemClock),
        );
        assert_eq!(lifecycle.phase(), Phase::Loading);
        assert_eq!(lifecycle.persistence().unwrap_err(), NotDurable::NotLoaded);
        assert!(!gate.is_ready());
        lifecycle.ready(&gate, Arc::new(VolatileLog), None).await;
        assert_eq!(lifecycle.phase(), Phase::Ready);
        assert!(gate.is_ready());
        lifecycle.loaded().await.unwrap();
        shutdown.trigger();
        assert_eq!(lifecycle.phase(), Phase::Draining);
    }

    #[tokio::test]
    async fn a_failed_load_stops_the_server_and_says_why() {
        let shutdown = Shutdown::default();
        let lifecycle = lifecycle(&shutdown, false).await;
        assert_eq!(lifecycle.persistence().unwrap_err(), NotDurable::InMemory);
        lifecycle.fail("damaged".to_string());
        assert!(shutdown.is_triggered());
        assert_eq!(lifecycle.phase(), Phase::Failed("damaged".to_string()));
        assert_eq!(lifecycle.loaded().await.unwrap_err(), "damaged");
    }
}
