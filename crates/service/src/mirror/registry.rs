//! The gate's side of mirrors' sub-leases ([`crate::core::sublease`]): per namespace, the core's
//! [`Mirrors`] on this process's monotonic clock, the grants, the acknowledgements, and the wait every
//! `Add` makes before it is acknowledged (rule 3).
//!
//! The clock's zero is when the registry was made, at start: rule 5's quiet period runs from there. Every
//! namespace counts it, mirrored or not — a mirror of the previous incarnation may hold a sub-lease on any.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Notify;

use crate::core::sublease::{Counted, Grant, Mirrors, Nanos, Terms};

/// Every mirror attached to this gate, by namespace.
#[derive(Debug)]
pub struct MirrorRegistry {
    terms: Terms,
    max_per_namespace: usize,
    /// The clock's zero.
    epoch: Instant,
    namespaces: Mutex<HashMap<Arc<str>, Namespace>>,
    /// Woken on every acknowledgement: the `Add`s waiting look again.
    acknowledged: Notify,
    next_id: AtomicU64,
}

/// One namespace's mirrors.
#[derive(Debug)]
struct Namespace {
    mirrors: Mirrors,
    /// Mirrors attached now (streams open).
    attached: usize,
}

/// A mirror's place at the gate, from its attachment until it is dropped (the stream ended).
#[derive(Debug)]
pub struct Attachment {
    registry: Arc<MirrorRegistry>,
    namespace: Arc<str>,
    id: u64,
}

impl MirrorRegistry {
    /// A registry granting sub-leases on `terms`, to at most `max_per_namespace` mirrors of a namespace.
    pub fn new(terms: Terms, max_per_namespace: usize) -> Arc<Self> {
        Arc::new(Self {
            terms,
            max_per_namespace,
            epoch: Instant::now(),
            namespaces: Mutex::new(HashMap::new()),
            acknowledged: Notify::new(),
            next_id: AtomicU64::new(1),
        })
    }

    /// The sub-leases' terms.
    pub fn terms(&self) -> Terms {
        self.terms
    }

    fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    fn namespaces(&self) -> MutexGuard<'_, HashMap<Arc<str>, Namespace>> {
        self.namespaces.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn with_namespace<T>(&self, namespace: &str, f: impl FnOnce(&mut Namespace) -> T) -> T {
        let mut namespaces = self.namespaces();
        if !namespaces.contains_key(namespace) {
            let fresh = Namespace {
                mirrors: Mirrors::new(self.terms, 0),
                attached: 0,
            };
            namespaces.insert(Arc::from(namespace), fresh);
        }
        f(namespaces.get_mut(namespace).expect("inserted"))
    }

    /// A place for one more mirror of `namespace`, or why not.
    pub fn attach(self: &Arc<Self>, namespace: &Arc<str>) -> Result<Attachment, String> {
        self.with_namespace(namespace, |entry| {
            if entry.attached >= self.max_per_namespace {
                return Err(format!(
                    "namespace {namespace:?} has {} mirrors attached, the limit ([mirrors] max_per_namespace)",
                    self.max_per_namespace
                ));
            }
            entry.attached += 1;
            metrics::gauge!("existence_mirrors_attached", "namespace" => namespace.to_string())
                .increment(1.0);
            Ok(Attachment {
                registry: Arc::clone(self),
                namespace: Arc::clone(namespace),
                id: self.next_id.fetch_add(1, Ordering::Relaxed),
            })
        })
    }

    /// Waits until `seq` of `namespace` counts as applied (rules 3 and 5): every mirror holding a live
    /// sub-lease acknowledged it, or its sub-lease ended.
    pub async fn applied(&self, namespace: &str, seq: u64) {
        let mut waited = None::<Instant>;
        loop {
            let acknowledged = self.acknowledged.notified();
            tokio::pin!(acknowledged);
            acknowledged.as_mut().enable();
            let now = self.now();
            let until = match self.with_namespace(namespace, |e| e.mirrors.applied(seq, now)) {
                Counted::Yes => break,
                Counted::Wait(until) => until,
            };
            waited.get_or_insert_with(Instant::now);
            let deadline = self.epoch + std::time::Duration::from_nanos(until);
            tokio::select! {
                () = acknowledged => {}
                () = tokio::time::sleep_until(deadline.into()) => {}
            }
        }
        if let Some(since) = waited {
            metrics::histogram!("existence_mirror_ack_wait_seconds", "namespace" => namespace.to_string())
                .record(since.elapsed().as_secs_f64());
        }
    }
}

impl Attachment {
    /// A sub-lease for this mirror, granted now; the gate has applied through `applied` and may answer
    /// `ABSENT` itself until `own_end` on its clock (a single server: always).
    pub fn grant(&self, applied: u64) -> Option<Grant> {
        let now = self.registry.now();
        let grant = self.registry.with_namespace(&self.namespace, |e| {
            e.mirrors.grant(self.id, now, Some(Nanos::MAX), applied)
        });
        if grant.is_some() {
            metrics::counter!("existence_mirror_subleases_granted_total", "namespace" => self.namespace.to_string())
                .increment(1);
        }
        grant
    }

    /// The mirror has applied through `seq`: if that raised the lowest acknowledgement among live
    /// sub-leases, `Add`s waiting look again. (Only then can one of them count: waking them on every
    /// acknowledgement had each `Add` woken once per mirror.)
    pub fn acknowledged(&self, seq: u64) {
        let now = self.registry.now();
        let raised = self.registry.with_namespace(&self.namespace, |e| {
            let before = e.mirrors.floor(now);
            e.mirrors.acked(self.id, seq);
            e.mirrors.floor(now) > before
        });
        if raised {
            self.registry.acknowledged.notify_waiters();
        }
    }
}

impl Drop for Attachment {
    /// Its stream ended: `Add`s still wait for it until its sub-lease ends, since nothing tells the gate the
    /// mirror stopped answering.
    fn drop(&mut self) {
        let now = self.registry.now();
        self.registry.with_namespace(&self.namespace, |e| {
            e.attached -= 1;
            e.mirrors.detached(self.id, now);
        });
        metrics::gauge!("existence_mirrors_attached", "namespace" => self.namespace.to_string())
            .decrement(1.0);
    }
}
