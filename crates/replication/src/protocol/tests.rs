//! The protocol's rules, one case at a time (the simulation beside them checks them together).

use super::*;

const MS: Nanos = 1_000_000;

fn timing() -> Timing {
    Timing {
        lease: 100 * MS,
        drift_ppm: 10_000,
        margin: MS,
    }
}

fn join(id: &str, nonce: u64) -> MemberRecord {
    MemberRecord::Join {
        id: id.into(),
        nonce,
        origin: String::new(),
    }
}

fn replica(id: &str, nonce: u64) -> Protocol {
    Protocol::new(
        Incarnation {
            id: id.into(),
            nonce,
        },
        timing(),
    )
}

#[test]
fn the_fallback_stretches_the_lease_by_the_drift_and_adds_the_margin() {
    assert_eq!(timing().fallback(), 102 * MS);
}

#[test]
fn a_lease_needs_a_membership_and_an_applied_barrier() {
    let mut r = replica("r", 1);
    r.apply(2, None, 0);
    r.barrier_acked(10 * MS, 3, 11 * MS);
    assert!(!r.should_join(), "the barrier is not applied yet");
    r.read_own_barrier(3, 10 * MS);
    r.apply(3, None, 12 * MS);
    r.settle(12 * MS);
    assert!(r.should_join());
    assert!(
        !r.may_answer_absent(13 * MS),
        "no lease before its own join is applied"
    );
    r.apply(4, Some(&join("r", 1)), 14 * MS);
    r.settle(14 * MS);
    assert_eq!(
        r.standing(),
        &Standing::Joining,
        "its join is read, not yet acknowledged there"
    );
    r.join_acked(4);
    r.barrier_acked(15 * MS, 5, 16 * MS);
    r.read_own_barrier(5, 15 * MS);
    r.apply(5, None, 17 * MS);
    r.settle(17 * MS);
    assert!(r.may_answer_absent(114 * MS) && !r.may_answer_absent(115 * MS));
    r.apply(6, Some(&join("r", 9)), 20 * MS);
    assert!(
        !r.may_answer_absent(21 * MS),
        "a twin's join ends the lease at once"
    );
    assert!(matches!(
        r.standing(),
        Standing::Departed {
            cause: Cause::Displaced(_),
            ..
        }
    ));
}

/// A member that has caught up: joined at 2, applied through 3.
fn member() -> Protocol {
    let mut r = replica("r", 1);
    r.join_acked(2);
    r.apply(2, Some(&join("r", 1)), 0);
    r.apply(3, None, 0);
    r.settle(0);
    r
}

#[test]
fn a_join_read_elsewhere_than_where_it_was_acknowledged_makes_no_member() {
    let mut r = replica("r", 1);
    // Its server stored its join at 2 alone; the quorum stored it at 3, where that copy holds another's.
    r.apply(2, Some(&join("r", 1)), 0);
    r.apply(3, Some(&join("w", 2)), 0);
    r.join_acked(3);
    assert_eq!(r.standing(), &Standing::Joining);
    assert_eq!(r.diverged(), Some(3));
}

#[test]
fn a_write_read_elsewhere_than_where_it_was_acknowledged_is_a_divergence() {
    let mut r = member();
    r.read_write(4, write(0));
    r.apply(4, None, MS);
    r.write_acked(4, write(0));
    assert_eq!(r.diverged(), None);
    r.read_write(
        5,
        WriteId {
            writer: 2,
            counter: 0,
        },
    );
    r.apply(5, None, MS);
    r.write_acked(5, write(1));
    assert_eq!(r.diverged(), Some(5));
    let mut passed = member();
    passed.pass_over(6);
    passed.write_acked(5, write(1));
    assert_eq!(passed.diverged(), None, "nothing was read there");
}

/// `r`'s barrier sent at `sent_at`, acknowledged at `seq` a millisecond later and read there as sent.
fn barrier_read_as_sent(r: &mut Protocol, sent_at: Nanos, seq: u64) {
    r.barrier_acked(sent_at, seq, sent_at + MS);
    r.read_own_barrier(seq, sent_at);
    r.apply(seq, None, sent_at + MS);
    r.settle(sent_at + MS);
}

#[test]
fn a_copy_that_differs_from_what_was_read_ends_the_lease_for_good() {
    let mut r = member();
    barrier_read_as_sent(&mut r, 10 * MS, 4);
    assert!(r.may_answer_absent(12 * MS));
    assert_eq!(
        r.checked_through(),
        Some(4),
        "a snapshot through 4 may be shared"
    );
    r.copy_differs(4);
    assert!(!r.may_answer_absent(12 * MS));
    assert_eq!(r.diverged(), Some(4));
    assert_eq!(r.checked_through(), None, "none may be shared");
    barrier_read_as_sent(&mut r, 20 * MS, 5);
    assert!(
        !r.may_answer_absent(22 * MS),
        "no lease from this history again"
    );
}

#[test]
fn a_barrier_grants_a_lease_only_if_read_as_sent_whichever_comes_first() {
    let mut acked_first = member();
    acked_first.barrier_acked(10 * MS, 5, 11 * MS);
    acked_first.apply(4, None, 11 * MS);
    acked_first.read_own_barrier(5, 10 * MS);
    acked_first.apply(5, None, 12 * MS);
    acked_first.settle(12 * MS);
    assert!(acked_first.may_answer_absent(109 * MS));

    let mut read_first = member();
    read_first.read_own_barrier(5, 10 * MS);
    read_first.apply(4, None, 11 * MS);
    read_first.apply(5, None, 11 * MS);
    read_first.settle(11 * MS);
    read_first.barrier_acked(10 * MS, 5, 12 * MS);
    assert!(read_first.may_answer_absent(109 * MS));
    assert_eq!(read_first.diverged(), None);
}

#[test]
fn a_copy_that_holds_something_else_at_a_barriers_seq_has_diverged_and_takes_no_lease_again() {
    let mut r = member();
    r.barrier_acked(10 * MS, 5, 11 * MS);
    // Its consumer's server stored another barrier of its own at 5 (one the quorum never acknowledged).
    r.read_own_barrier(5, 8 * MS);
    r.apply(4, None, 11 * MS);
    r.apply(5, None, 11 * MS);
    r.settle(11 * MS);
    assert_eq!(r.diverged(), Some(5));
    assert!(!r.may_answer_absent(12 * MS));
    r.barrier_acked(20 * MS, 6, 21 * MS);
    r.read_own_barrier(6, 20 * MS);
    r.apply(6, None, 21 * MS);
    r.settle(21 * MS);
    assert!(!r.may_answer_absent(22 * MS), "never again");

    let mut late = member();
    late.apply(4, None, 11 * MS);
    late.apply(5, Some(&join("w", 2)), 11 * MS);
    late.settle(11 * MS);
    late.barrier_acked(10 * MS, 5, 12 * MS);
    assert_eq!(
        late.diverged(),
        Some(5),
        "acknowledged after a record was read there"
    );
}

#[test]
fn a_barrier_passed_over_grants_nothing_and_is_no_divergence() {
    let mut r = member();
    r.barrier_acked(10 * MS, 5, 11 * MS);
    r.pass_over(6);
    r.settle(11 * MS);
    r.barrier_acked(10 * MS, 5, 12 * MS);
    assert_eq!(r.applied(), 6);
    assert!(!r.may_answer_absent(12 * MS));
    assert_eq!(r.diverged(), None);
}

#[test]
fn a_batch_is_reported_to_its_one_writer_to_everyone_for_several_and_to_nobody_for_its_own() {
    let mut r = replica("r", 1);
    r.apply(2, Some(&join("r", 1)), 0);
    r.apply(3, Some(&join("w", 2)), 0);
    r.apply(4, Some(&join("v", 3)), 0);
    assert_eq!(r.recipients([]), Recipients::Nobody);
    assert_eq!(r.recipients([1, 1]), Recipients::Nobody, "its own writes");
    assert_eq!(r.recipients([2, 1, 2]), Recipients::Writer(2));
    assert_eq!(r.recipients([2, 3]), Recipients::Everyone);
    assert_eq!(
        r.recipients([7]),
        Recipients::Everyone,
        "a writer not known as a member (joining, or an older build's message id) hears the broadcast"
    );
}

/// Write number `counter` of the process with nonce 1.
fn write(counter: u64) -> WriteId {
    WriteId { writer: 1, counter }
}

fn read(seq: u64, write: WriteId) -> WriteRead {
    WriteRead { seq, write }
}

#[test]
fn a_writer_waits_for_every_member_and_departed_incarnations_through_their_grace() {
    let mut w = replica("w", 1);
    w.apply(2, Some(&join("w", 1)), 0);
    w.apply(3, Some(&join("r", 2)), 0);
    w.read_write(4, write(0));
    w.apply(4, None, MS);
    assert_eq!(
        w.ack(4, write(0), Acked::first_time(MS), 2 * MS),
        Ack::Wait(103 * MS)
    );
    w.heard_reads(2, &[read(4, write(0))]);
    assert_eq!(
        w.ack(4, write(0), Acked::first_time(MS), 2 * MS),
        Ack::Early
    );
    w.apply(5, Some(&MemberRecord::Remove { id: "r".into() }), 10 * MS);
    w.read_write(6, write(1));
    w.apply(6, None, 11 * MS);
    w.settle(11 * MS);
    assert_eq!(w.missing_reports(6, write(1)), vec![], "r is no member now");
    assert_eq!(
        w.ack(6, write(1), Acked::first_time(11 * MS), 12 * MS),
        Ack::Wait(112 * MS),
        "a removed member may hold a lease from before its removal for one more fallback"
    );
    assert_eq!(
        w.ack(6, write(1), Acked::first_time(11 * MS), 112 * MS),
        Ack::Early
    );
    w.heard_reads(2, &[read(6, write(1))]);
    assert_eq!(
        w.ack(6, write(1), Acked::first_time(11 * MS), 12 * MS),
        Ack::Early,
        "or until it reports"
    );
    assert_eq!(
        w.ack(6, write(1), Acked::first_time(11 * MS), 113 * MS),
        Ack::ByFallback
    );
}

/// A write published more than once may be read at its seq off a copy that differs from the quorum's
/// before it (an earlier attempt stored there by a cut-off server alone): every member's report does not
/// make up for the members that copy may hide, so only the fallback acknowledges it.
#[test]
fn a_write_published_more_than_once_is_acknowledged_only_by_the_fallback() {
    let mut w = replica("w", 1);
    w.apply(2, Some(&join("w", 1)), 0);
    w.apply(3, Some(&join("r", 2)), 0);
    w.read_write(4, write(0));
    w.apply(4, None, MS);
    w.heard_reads(2, &[read(4, write(0))]);
    let retried = Acked {
        at: MS,
        attempts: 2,
    };
    assert_eq!(w.ack(4, write(0), retried, 2 * MS), Ack::Wait(103 * MS));
    assert_eq!(w.ack(4, write(0), retried, 103 * MS), Ack::ByFallback);
    assert_eq!(
        w.ack(4, write(0), Acked::first_time(MS), 2 * MS),
        Ack::Early,
        "published once, it waits for the report alone"
    );
}

/// A writer started from a snapshot that covers a removal knows the members, not the removed one's
/// grace: it acknowledges only by the fallback until a fallback has passed since it started.
#[test]
fn a_writer_started_from_a_snapshot_acknowledges_early_only_a_fallback_after_it_started() {
    let mut w = replica("w", 1);
    let mut members = Membership::default();
    members.apply(2, &join("w", 1));
    members.apply(3, &join("r", 2));
    members.apply(4, &join("gone", 3));
    members.apply(5, &MemberRecord::Remove { id: "gone".into() });
    w.start_after(5, members, 1_000 * MS);
    w.read_write(6, write(0));
    w.apply(6, None, 1_001 * MS);
    w.settle(1_001 * MS);
    w.heard_reads(2, &[read(6, write(0))]);
    assert_eq!(
        w.ack(6, write(0), Acked::first_time(1_001 * MS), 1_002 * MS),
        Ack::Wait(1_102 * MS),
        "\"gone\" may hold a lease from before its removal, which the snapshot does not say"
    );
    assert_eq!(
        w.ack(6, write(0), Acked::first_time(1_001 * MS), 1_102 * MS),
        Ack::Early
    );
}

#[test]
fn only_a_report_of_the_writers_very_message_at_its_seq_counts() {
    let mut w = replica("w", 1);
    w.apply(2, Some(&join("w", 1)), 0);
    w.apply(3, Some(&join("r", 2)), 0);
    w.read_write(4, write(7));
    w.apply(4, None, MS);
    w.heard(2, 9);
    assert_eq!(
        w.ack(4, write(7), Acked::first_time(MS), 2 * MS),
        Ack::Wait(103 * MS),
        "how far r applied says nothing of what it read at 4"
    );
    // r's server's copy diverged: at 4 it holds another of w's writes, and w's is one seq later.
    w.heard_reads(2, &[read(4, write(6)), read(5, write(7))]);
    assert_eq!(
        w.ack(4, write(7), Acked::first_time(MS), 2 * MS),
        Ack::Wait(103 * MS)
    );
    assert_eq!(w.missing_reports(4, write(7)), vec![("r".to_string(), 2)]);
    w.heard_reads(
        2,
        &[read(
            4,
            WriteId {
                writer: 3,
                counter: 7,
            },
        )],
    );
    assert_eq!(
        w.ack(4, write(7), Acked::first_time(MS), 2 * MS),
        Ack::Wait(103 * MS),
        "another writer's message is no read of w's"
    );

    let mut diverged_writer = replica("w", 1);
    diverged_writer.apply(2, Some(&join("w", 1)), 0);
    diverged_writer.read_write(4, write(6));
    diverged_writer.apply(4, None, MS);
    assert_eq!(
        diverged_writer.ack(4, write(7), Acked::first_time(MS), 2 * MS),
        Ack::Wait(103 * MS),
        "nor does the writer count itself if it read something else at the seq"
    );
}
