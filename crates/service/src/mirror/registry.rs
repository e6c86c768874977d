//! The gate's side of mirrors' sub-leases ([`crate::core::sublease`]): per namespace, the core's
//! [`Mirrors`] on this process's monotonic clock, the grants, the acknowledgements, and the wait an `Add`
//! makes before it counts as applied (rule 3).
//!
//! Whose lease the grants rest on ([`OwnLease`]): a single server may always answer `ABSENT`, and its clock's
//! zero is when the registry was made, at start: rule 5's quiet period runs from there (every namespace counts
//! it, mirrored or not — a mirror of the previous incarnation may hold a sub-lease on any). A replica grants
//! only under its read lease, on that lease's clock, and needs no quiet period ([`Mirrors::of_replica`]).
//!
//! A grant reads the gate's own lease and then its applied seq *inside* the registry's lock, after any `Add`
//! counted before it: read before, an `Add` applied and counted in between (no live sub-lease to wait for)
//! would be acknowledged while the grant named an older seq, and the mirror would hold without it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::core::clock::{MonotonicClock, SystemMonotonicClock};
use crate::core::lease::ReadLease;
use crate::core::sublease::{Counted, Grant, MirrorWait, Mirrors, Nanos, Terms};
use crate::core::writes::Pending;

/// What this gate's grants rest on (rule 1).
#[derive(Debug)]
pub enum OwnLease {
    /// A single server: it may always answer `ABSENT`.
    Always,
    /// A replica: only while its read lease holds, and never past its end.
    Replica(Arc<ReadLease>),
}

/// Every mirror attached to this gate, by namespace.
#[derive(Debug)]
pub struct MirrorRegistry {
    terms: Terms,
    max_per_namespace: usize,
    /// What grants rest on.
    own: OwnLease,
    /// A single server's clock, whose zero is the registry's making (a replica's is its read lease's).
    started: SystemMonotonicClock,
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
    /// A registry granting sub-leases on `terms` under `own`, to at most `max_per_namespace` mirrors of a
    /// namespace.
    pub fn new(terms: Terms, max_per_namespace: usize, own: OwnLease) -> Arc<Self> {
        Arc::new(Self {
            terms,
            max_per_namespace,
            own,
            started: SystemMonotonicClock::new(),
            namespaces: Mutex::new(HashMap::new()),
            acknowledged: Notify::new(),
            next_id: AtomicU64::new(1),
        })
    }

    /// The sub-leases' terms.
    pub fn terms(&self) -> Terms {
        self.terms
    }

    /// Now on the clock sub-leases are measured on: a replica's read lease's.
    fn now(&self) -> Nanos {
        match &self.own {
            OwnLease::Always => self.started.now_ns(),
            OwnLease::Replica(lease) => lease.now(),
        }
    }

    /// Until when this gate may answer `ABSENT` itself, read at `now` (`None`: not now).
    fn own_end(&self, now: Nanos) -> Option<Nanos> {
        match &self.own {
            OwnLease::Always => Some(Nanos::MAX),
            // `holds` marks the lease wanted: a replica whose mirrors answer for it sees few lookups, and
            // would otherwise stop renewing the lease its grants rest on.
            OwnLease::Replica(lease) => lease
                .holds()
                .then(|| lease.until())
                .filter(|end| *end > now),
        }
    }

    fn namespaces(&self) -> MutexGuard<'_, HashMap<Arc<str>, Namespace>> {
        self.namespaces.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn with_namespace<T>(&self, namespace: &str, f: impl FnOnce(&mut Namespace) -> T) -> T {
        let mut namespaces = self.namespaces();
        if !namespaces.contains_key(namespace) {
            let mirrors = match self.own {
                OwnLease::Always => Mirrors::new(self.terms, 0),
                OwnLease::Replica(_) => Mirrors::of_replica(self.terms),
            };
            let fresh = Namespace {
                mirrors,
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

    /// Whether `seq` of `namespace` counts as applied now: rules 3 and 5.
    fn counted_at(&self, namespace: &str, seq: u64, now: Nanos) -> Counted {
        self.with_namespace(namespace, |e| e.mirrors.applied(seq, now))
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
            let until = match self.counted_at(namespace, seq, now) {
                Counted::Yes => break,
                Counted::Wait(until) => until,
            };
            waited.get_or_insert_with(Instant::now);
            tokio::select! {
                () = acknowledged => {}
                () = tokio::time::sleep(Duration::from_nanos(until.saturating_sub(now))) => {}
            }
        }
        if let Some(since) = waited {
            metrics::histogram!("existence_mirror_ack_wait_seconds", "namespace" => namespace.to_string())
                .record(since.elapsed().as_secs_f64());
        }
    }

    /// Waits until every sub-lease granted so far has ended ([`MirrorWait::all_ended`]).
    async fn all_ended(&self) {
        loop {
            let now = self.now();
            let last = (self.namespaces().values())
                .map(|e| e.mirrors.last_end())
                .max()
                .unwrap_or(0);
            if last <= now {
                return;
            }
            tokio::time::sleep(Duration::from_nanos(last - now)).await;
        }
    }
}

impl MirrorWait for MirrorRegistry {
    fn counted(&self, namespace: &str, seq: u64) -> bool {
        self.counted_at(namespace, seq, self.now()) == Counted::Yes
    }

    fn applied<'a>(&'a self, namespace: &'a str, seq: u64) -> Pending<'a, ()> {
        Box::pin(MirrorRegistry::applied(self, namespace, seq))
    }

    fn all_ended(&self) -> Pending<'_, ()> {
        Box::pin(MirrorRegistry::all_ended(self))
    }
}

impl Attachment {
    /// A sub-lease for this mirror, granted now if this gate may answer `ABSENT` itself (rule 1), with the
    /// seq `applied` reads: the latest this mirror is sent. Both are read under the registry's lock, the
    /// own lease first (see the module's doc). Returns that seq, and the grant if made.
    pub fn grant(&self, applied: impl FnOnce() -> u64) -> (u64, Option<Grant>) {
        let registry = &self.registry;
        let (applied, grant) = registry.with_namespace(&self.namespace, |e| {
            let now = registry.now();
            let own_end = registry.own_end(now);
            let applied = applied();
            (applied, e.mirrors.grant(self.id, now, own_end, applied))
        });
        if grant.is_some() {
            metrics::counter!("existence_mirror_subleases_granted_total", "namespace" => self.namespace.to_string())
                .increment(1);
        }
        (applied, grant)
    }

    /// The highest seq the mirror's answers may claim as observed: a replica's vouched seq (see
    /// [`ReadLease::observed_seq`]); 0 for a single server, whose log is the log.
    pub fn observable_seq(&self) -> u64 {
        match &self.registry.own {
            OwnLease::Always => 0,
            OwnLease::Replica(lease) => lease.observed_seq(u64::MAX),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::clock::ManualClock;

    const MS: Nanos = 1_000_000;
    const TERMS: Terms = Terms {
        length: 300 * MS,
        drift_ppm: 10_000,
        margin: MS,
    };

    fn replica_registry() -> (Arc<ManualClock>, Arc<ReadLease>, Arc<MirrorRegistry>) {
        let clock = Arc::new(ManualClock::new(1_000));
        let lease = Arc::new(ReadLease::new(Arc::clone(&clock) as _));
        let registry = MirrorRegistry::new(TERMS, 2, OwnLease::Replica(Arc::clone(&lease)));
        (clock, lease, registry)
    }

    /// A replica grants nothing without its read lease, and never past the lease's end (rule 1); nor does it
    /// wait out a quiet period at its start, which the replicas' own fallback covers.
    #[test]
    fn a_replica_grants_only_under_its_lease_and_never_past_it() {
        let (clock, lease, registry) = replica_registry();
        let attachment = registry.attach(&Arc::from("users")).unwrap();
        assert_eq!(attachment.grant(|| 7), (7, None), "no lease, no grant");
        assert!(
            MirrorWait::counted(&*registry, "users", 7),
            "no quiet period"
        );
        lease.set_until(lease.now() + 100 * MS);
        let (_, grant) = attachment.grant(|| 7);
        assert_eq!(
            grant,
            Some(Grant {
                length: 100 * MS,
                from_seq: 7
            }),
            "capped at what the lease has left"
        );
        assert!(
            !MirrorWait::counted(&*registry, "users", 8),
            "seq 8 waits for the mirror"
        );
        attachment.acknowledged(7);
        clock.advance(100);
        assert!(
            MirrorWait::counted(&*registry, "users", 8),
            "the sub-lease ended with the lease"
        );
        assert_eq!(attachment.grant(|| 8).1, None, "the lease ended");
    }

    /// The seq a grant names is read under the registry's lock, after any `Add` counted before the grant:
    /// read before it, an `Add` counted in between (no live sub-lease to wait for) could be acknowledged
    /// while the grant named an older seq, and the mirror would hold without it.
    #[test]
    fn a_grant_reads_the_applied_seq_under_the_registrys_lock() {
        let registry = MirrorRegistry::new(TERMS, 2, OwnLease::Always);
        let attachment = registry.attach(&Arc::from("users")).unwrap();
        let (applied, _) = attachment.grant(|| {
            assert!(
                registry.namespaces.try_lock().is_err(),
                "the applied seq was read outside the lock"
            );
            5
        });
        assert_eq!(applied, 5);
    }
}
