//! Sub-leases: the rules under which a **mirror** — a client library's in-process copy of a namespace's
//! filter, fed the gate's mutations in seq order — may answer `ABSENT` without asking the gate, and why it
//! then never answers it for an acknowledged key (P1).
//!
//! A mirror is attached to one gate process G: a single server, or one replica. G is where its mutations come
//! from and what it answers to. Four rules, each checked by the simulation below (which fails when any one is
//! taken out):
//!
//! 1. **Grants.** A mirror asks G for a sub-lease, noting on its own monotonic clock when it asked. G grants
//!    one only while it may answer `ABSENT` itself (a replica: under its read lease), for
//!    `min(SUBLEASE, own lease's end − now)` on G's clock, so no sub-lease outlives G's own lease; it records
//!    the grant's end on its clock (the *server end*), and the grant carries G's applied seq (`from_seq`).
//!    G renews a mirror's sub-lease only once the mirror has acknowledged the `from_seq` of its previous
//!    grant: one that keeps asking but does not apply (stuck, or hostile) is not granted again, so it holds
//!    `Add`s back by at most one sub-lease, as a silent one does. (Refusing a grant is always safe.)
//! 2. **The mirror's end.** The mirror holds the sub-lease from the moment it has applied `from_seq` until
//!    `asked + length × (1 − ρ) − margin` on its own clock. It asked before G granted (the request
//!    travelled), so the travel counts against the mirror; and a mirror clock up to ρ faster than G's still
//!    reaches that end, in true time, no later than G reaches the server end. So a mirror never holds a
//!    sub-lease that G counts as over.
//! 3. **Acknowledgements.** G counts an `Add` at seq N as applied — before it acknowledges the write, and (a
//!    replica) before it reports N applied to writers — only once every mirror whose server end is still
//!    ahead has acknowledged N (it applied N), or that end has passed. A mirror that is slow, paused or cut
//!    off delays acknowledgements by at most one sub-lease.
//! 4. **Lookups.** A mirror checks its sub-lease, then reads its filter; only `ABSENT` needs the sub-lease.
//! 5. **Restarts.** G forgets its mirrors when it restarts, while a mirror may still hold a sub-lease it
//!    granted before; so a G that has just started counts nothing as applied until one sub-lease (with the
//!    drift and margin) has passed on its clock since it started. (A replica needs none: the replicas'
//!    writers already wait out a previous incarnation's lease, and with it every sub-lease it granted;
//!    [`Mirrors::of_replica`].)
//!
//! Why that is P1: let an `Add` at seq N be acknowledged at true time T, and a mirror lookup start at t ≥ T
//! under a sub-lease granted at G-time g. If G granted it after T, G had applied N by then (a single server
//! applies before it acknowledges; a replica holding a lease after T has applied N, which is the replicas'
//! own P1), so `from_seq ≥ N` and the mirror, holding, has applied N. If G granted it before T and its server
//! end had not passed by T, rule 3 made G wait for this mirror's acknowledgement of N — unless (a replica G)
//! the writer acknowledged N by the replicas' fallback without G's report: then every lease G held before N
//! was over by T, and with it (rule 1) every sub-lease it granted; or without waiting for G at all, G having
//! left the membership: G gave its lease up, then published its leave only once every sub-lease it granted
//! had ended ([`MirrorWait::all_ended`]), so before T. If its server end had passed by T, rule 2
//! ended the mirror's hold before T.
//!
//! The sub-lease's cost is rule 3: one round trip from G to its slowest mirror on every acknowledgement, and
//! up to a sub-lease on a mirror that stops answering.

use std::collections::HashMap;

/// Nanoseconds on a monotonic clock.
pub type Nanos = u64;

/// The durations of sub-leases: set by G, sent to each mirror with its grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    /// The longest sub-lease G grants.
    pub length: Nanos,
    /// ρ, in parts per million: how much faster one process's monotonic clock may run than another's.
    pub drift_ppm: u64,
    /// Taken off every mirror's end for how coarsely clocks are read: at least two grains of the coarsest
    /// reading, since the mirror's reading at a lookup and G's at a grant may each be a grain early.
    pub margin: Nanos,
}

/// A sub-lease G granted: its length on G's clock, and the seq G had applied when it granted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub length: Nanos,
    pub from_seq: u64,
}

/// A mirror's standing at G.
#[derive(Debug, Clone, Copy, Default)]
struct Attached {
    /// The end of its latest grant, on G's clock (0: none).
    server_end: Nanos,
    /// The highest seq it acknowledged having applied.
    acked: u64,
    /// Its stream ended: forgotten once its sub-lease is over too.
    gone: bool,
    /// The `from_seq` of its latest grant, which it must acknowledge before it is granted again.
    granted_from: Option<u64>,
}

/// G's side: the mirrors attached to it, their grants and acknowledgements.
#[derive(Debug)]
pub struct Mirrors {
    terms: Terms,
    attached: HashMap<u64, Attached>,
    /// Until then (G's clock) no seq counts as applied: sub-leases an earlier incarnation granted may hold.
    quiet_until: Nanos,
}

/// Whether G may count a seq as applied at a moment ([`Mirrors::applied`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// Every mirror holding a live sub-lease has applied it.
    Yes,
    /// Not before this moment on G's clock (the earliest server end among the mirrors still behind), or an
    /// acknowledgement from them.
    Wait(Nanos),
}

impl Terms {
    /// `length × (1 + ρ) + margin`: how long after G granted a sub-lease no mirror can hold it any more.
    pub fn outlasted(&self) -> Nanos {
        crate::lease::outlasted(self.length, self.drift_ppm, self.margin)
    }
}

impl Mirrors {
    /// The mirrors of a G that started at `started` on its clock (rule 5).
    pub fn new(terms: Terms, started: Nanos) -> Self {
        Self {
            terms,
            attached: HashMap::new(),
            quiet_until: started.saturating_add(terms.outlasted()),
        }
    }

    /// The mirrors of a replica: no quiet period at its start. Every sub-lease a previous incarnation
    /// granted ended, on its clock, no later than that incarnation's read lease (rule 1), and the replicas'
    /// writers wait for a displaced or removed incarnation until its lease is over (the replication
    /// protocol's grace and fallback): what rule 5 waits for is already waited for.
    pub fn of_replica(terms: Terms) -> Self {
        Self {
            terms,
            attached: HashMap::new(),
            quiet_until: 0,
        }
    }

    /// Mirror `id` asks for a sub-lease at `now` on G's clock; G has applied through `applied` and may itself
    /// answer `ABSENT` until `own_end` (`None`: it may not now; `Some(u64::MAX)`: a single server, always).
    /// Rule 1.
    pub fn grant(
        &mut self,
        id: u64,
        now: Nanos,
        own_end: Option<Nanos>,
        applied: u64,
    ) -> Option<Grant> {
        self.forget_gone(now);
        let own_end = own_end.filter(|end| *end > now)?;
        let length = self.terms.length.min(own_end - now);
        let mirror = self.attached.entry(id).or_default();
        if mirror.granted_from.is_some_and(|from| mirror.acked < from) {
            return None;
        }
        mirror.server_end = mirror.server_end.max(now + length);
        mirror.granted_from = Some(applied);
        Some(Grant {
            length,
            from_seq: applied,
        })
    }

    /// Mirror `id` has applied through `seq`. Kept even before its first grant: a mirror acknowledges the
    /// copy it downloaded before it asks, and without that acknowledgement it would be granted once and then
    /// not again until an `Add` came (rule 1's renewal waits for the grant's `from_seq`).
    pub fn acked(&mut self, id: u64, seq: u64) {
        let mirror = self.attached.entry(id).or_default();
        mirror.acked = mirror.acked.max(seq);
    }

    /// Mirror `id` is gone (its stream ended): it is still waited for until its server end, since nothing
    /// tells G it stopped answering, and forgotten after.
    pub fn detached(&mut self, id: u64, now: Nanos) {
        if let Some(mirror) = self.attached.get_mut(&id) {
            mirror.gone = true;
        }
        self.forget_gone(now);
    }

    /// Forgets the attachments that are gone and whose sub-leases are over: mirrors that come and go would
    /// otherwise grow the map for ever. (One still attached keeps its entry, and what it acknowledged, between
    /// grants.)
    fn forget_gone(&mut self, now: Nanos) {
        self.attached
            .retain(|_, mirror| !(mirror.gone && mirror.server_end <= now));
    }

    /// The lowest seq acknowledged by a mirror whose sub-lease is live at `now` (`u64::MAX`: none): a seq
    /// above it waits for an acknowledgement, so an acknowledgement that does not raise it lets no seq count
    /// that did not before (G need not look again).
    pub fn floor(&self, now: Nanos) -> u64 {
        self.attached
            .values()
            .filter(|mirror| mirror.server_end > now)
            .map(|mirror| mirror.acked)
            .min()
            .unwrap_or(u64::MAX)
    }

    /// The latest server end among the sub-leases granted (0: none): until then a mirror may hold one.
    pub fn last_end(&self) -> Nanos {
        self.attached
            .values()
            .map(|mirror| mirror.server_end)
            .max()
            .unwrap_or(0)
    }

    /// Whether G may count `seq` as applied at `now` (rules 3 and 5).
    pub fn applied(&self, seq: u64, now: Nanos) -> Counted {
        if now < self.quiet_until {
            return Counted::Wait(self.quiet_until);
        }
        let mut until = None::<Nanos>;
        for mirror in self.attached.values() {
            if mirror.server_end > now && mirror.acked < seq {
                until = Some(until.map_or(mirror.server_end, |u| u.min(mirror.server_end)));
            }
        }
        until.map_or(Counted::Yes, Counted::Wait)
    }
}

/// Rule 3 as a gate's writes see it, implemented where the gate keeps its mirrors (the service's registry):
/// a single server's `Add` waits on it before it is acknowledged, a replica before it reports another
/// writer's `Add` applied and before it acknowledges its own.
pub trait MirrorWait: Send + Sync + std::fmt::Debug {
    /// Whether `seq` of `namespace` counts as applied now.
    fn counted(&self, namespace: &str, seq: u64) -> bool;

    /// Resolves once `seq` of `namespace` counts as applied.
    fn applied<'a>(&'a self, namespace: &'a str, seq: u64) -> crate::writes::Pending<'a, ()>;

    /// Resolves once every sub-lease granted so far has ended on the gate's clock. A replica leaving the
    /// membership gives its read lease up, so grants no more, then waits for this before it publishes its
    /// leave: writers stop waiting for it once they applied the leave, and a mirror holding a sub-lease
    /// from it past that point could answer `ABSENT` for an `Add` it never saw.
    fn all_ended(&self) -> crate::writes::Pending<'_, ()>;
}

/// The mirror's side: its sub-lease as it holds it.
#[derive(Debug, Clone, Copy)]
pub struct Sublease {
    terms: Terms,
    /// The end on the mirror's clock of the newest grant (0: none).
    end: Nanos,
    /// The seq it must have applied before the newest grant holds.
    from_seq: u64,
}

impl Sublease {
    pub fn new(terms: Terms) -> Self {
        Self {
            terms,
            end: 0,
            from_seq: 0,
        }
    }

    /// G granted `grant` to the request the mirror sent at `asked` on its clock (rule 2). A grant shorter
    /// than what it already holds (answering a request sent earlier) changes nothing.
    pub fn granted(&mut self, asked: Nanos, grant: Grant) {
        let shrunk = u128::from(grant.length)
            * u128::from(1_000_000 - self.terms.drift_ppm.min(1_000_000))
            / 1_000_000;
        let end = (asked + shrunk as u64).saturating_sub(self.terms.margin);
        if end > self.end {
            self.end = end;
            self.from_seq = self.from_seq.max(grant.from_seq);
        }
    }

    /// Whether the mirror may answer `ABSENT` at `now` on its clock, having applied through `applied`.
    pub fn holds(&self, now: Nanos, applied: u64) -> bool {
        now < self.end && applied >= self.from_seq
    }

    /// The end on the mirror's clock until which it holds, having applied through `applied` (0: it does
    /// not hold): [`holds`](Self::holds) at any moment before it, as a value lookups can read alone.
    pub fn holding_until(&self, applied: u64) -> Nanos {
        if applied >= self.from_seq {
            self.end
        } else {
            0
        }
    }

    /// Gives the sub-lease up (a gap in the mutations, a resync): no `ABSENT` until the next grant.
    pub fn drop_lease(&mut self) {
        self.end = 0;
    }
}

#[cfg(test)]
mod simulation;

#[cfg(test)]
mod tests {
    use super::*;

    const TERMS: Terms = Terms {
        length: 1_000,
        drift_ppm: 0,
        margin: 0,
    };

    /// The floor moves only with the mirror that holds it down, and leaves out sub-leases that ended: what
    /// lets G look again only when an acknowledgement can have let a seq count.
    #[test]
    fn the_floor_is_the_lowest_acknowledgement_among_live_subleases() {
        let mut mirrors = Mirrors::new(TERMS, 0);
        let now = TERMS.outlasted();
        assert_eq!(mirrors.floor(now), u64::MAX);
        mirrors.grant(1, now, Some(u64::MAX), 5);
        mirrors.grant(2, now + 500, Some(u64::MAX), 5);
        assert_eq!(mirrors.floor(now), 0);
        mirrors.acked(1, 7);
        assert_eq!(mirrors.floor(now), 0, "mirror 2 still holds it down");
        assert_eq!(mirrors.applied(7, now), Counted::Wait(now + 1_500));
        mirrors.acked(2, 9);
        assert_eq!(mirrors.floor(now), 7);
        assert_eq!(mirrors.applied(7, now), Counted::Yes);
        assert_eq!(mirrors.applied(8, now), Counted::Wait(now + 1_000));
        assert_eq!(mirrors.floor(now + 1_000), 9, "mirror 1's sub-lease ended");
        assert_eq!(mirrors.applied(8, now + 1_000), Counted::Yes);
    }

    /// A mirror acknowledges its download before it first asks: that counts, so it is granted again with
    /// no `Add` in between (a replica's sub-leases, capped by its read lease, need renewing every few tens of
    /// milliseconds).
    #[test]
    fn an_acknowledgement_before_the_first_grant_counts_for_the_renewal() {
        let mut mirrors = Mirrors::new(TERMS, 0);
        let now = TERMS.outlasted();
        mirrors.acked(1, 5);
        assert!(mirrors.grant(1, now, Some(u64::MAX), 5).is_some());
        assert!(
            mirrors.grant(1, now + 250, Some(u64::MAX), 5).is_some(),
            "renewed with no Add in between"
        );
        assert_eq!(mirrors.floor(now), 5);
    }

    /// A mirror that keeps asking but never acknowledges is not granted again: the `Add`s waiting for it
    /// wait out one sub-lease, not for as long as it asks.
    #[test]
    fn a_mirror_that_asks_but_does_not_apply_is_not_granted_again() {
        let mut mirrors = Mirrors::new(TERMS, 0);
        let now = TERMS.outlasted();
        assert!(mirrors.grant(1, now, Some(u64::MAX), 5).is_some());
        assert_eq!(mirrors.grant(1, now + 250, Some(u64::MAX), 6), None);
        assert_eq!(mirrors.applied(6, now + 999), Counted::Wait(now + 1_000));
        assert_eq!(mirrors.applied(6, now + 1_000), Counted::Yes);
        mirrors.acked(1, 5);
        assert!(mirrors.grant(1, now + 1_000, Some(u64::MAX), 6).is_some());
    }
}
