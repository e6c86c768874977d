"""GateClient against real gates: coalescing, deadlines, cancellation, errors, addresses."""

import asyncio
import concurrent.futures as cf
import subprocess
import os
import time

import grpc
import pytest

from existence_gate_client import AbsenceKind, GateClient, GateError, RecordOutcome
from existence_gate_client._gen import existence_pb2 as pb
from existence_gate_client._gen import existence_pb2_grpc as pb_grpc

from conftest import closed_port_address, concurrently, eventually


def unary_answer(gate, namespace, key):
    with grpc.insecure_channel(gate.grpc_addr) as channel:
        stub = pb_grpc.ExistenceGateStub(channel)
        return stub.MayExist(pb.MayExistRequest(namespace=namespace, key=key.encode()), timeout=5)


def add_keys(gate, namespace, keys):
    """Adds keys through a client of its own, so the client under test sends no call it does not expect."""
    with GateClient(gate.grpc_addr, namespace, coalesce_window=0, deadline=5) as writer:
        return writer.add(keys)


def hold_a_batch(client, timeout):
    """Sends a lookup that stays in flight (the client's first address is a black hole, and round robin sends
    its first batch there) and waits until it is sent: pending lookups then wait for their window, a full
    batch or this one's end (at `timeout`)."""
    held = client.may_exist_future("held", timeout=timeout)
    assert eventually(lambda: client.stats().gate_calls == 1), client.stats()
    return held


def test_concurrent_lookups_are_coalesced_and_match_unary_answers(gate, namespace):
    added = ["added:{}".format(i) for i in range(32)]
    keys = [k for pair in zip(added, ("never:{}".format(i) for i in range(32))) for k in pair]
    batches_before = gate.requests("BatchMayExist")
    with GateClient(gate.grpc_addr, namespace, coalesce_window=0.05, deadline=5) as client:
        client.add(added)
        answers = concurrently(len(keys), lambda i: client.may_exist(keys[i]))
        stats = client.stats()
    for key, answer in zip(keys, answers):
        assert not isinstance(answer, BaseException), answer
        expected = unary_answer(gate, namespace, key)
        assert answer.may_exist == (expected.answer == pb.ANSWER_MAY_EXIST), key
        assert not answer.warming
        assert 0 < answer.observed_seq <= expected.observed_seq
    assert sum(a.may_exist for a in answers) >= 32  # the added keys (a never-added one may be a false positive)
    assert not any(answers[i].may_exist is False for i in range(0, 64, 2))
    assert stats.lookups == 64
    assert stats.batched_keys == 64
    assert stats.gate_calls < stats.lookups, stats
    assert gate.requests("BatchMayExist") - batches_before == stats.gate_calls


def test_a_lone_caller_does_not_wait_for_the_window(gate, namespace):
    # Nothing in flight: each lookup leaves at once. Were the window waited, each would fail at its deadline.
    add_keys(gate, namespace, ["lone:2"])
    with GateClient(gate.grpc_addr, namespace, coalesce_window=3600, deadline=10) as client:
        answers = [client.may_exist("lone:{}".format(i)) for i in range(5)]
        stats = client.stats()
    assert [a.may_exist for a in answers] == [False, False, True, False, False]
    assert stats.lookups == 5 and stats.gate_calls == 5 and stats.batched_keys == 5


def test_a_pending_batch_leaves_when_the_batch_in_flight_is_answered(gate, namespace, black_hole):
    # The held batch is answered long before the window (its first address never answers: after half its
    # 0.6 s it moves to the live gate): the lookup waiting behind it is sent then, not at the window.
    with GateClient([black_hole, gate.grpc_addr], namespace, coalesce_window=3600, deadline=10) as client:
        held = hold_a_batch(client, timeout=0.6)
        waiting = client.may_exist_future("behind")
        assert held.result(timeout=10).may_exist is False
        assert waiting.result(timeout=10).may_exist is False
        stats = client.stats()
    assert stats.gate_calls == 2 and stats.batched_keys == 2, stats
    assert stats.retries == 1, stats


def test_a_full_batch_is_sent_without_waiting_for_the_window(gate, namespace, black_hole):
    # A batch is in flight (on a black hole for half its 40 s) and the window is an hour: only holding
    # coalesce_max_keys keys sends it.
    with GateClient(
        [black_hole, gate.grpc_addr], namespace, coalesce_window=3600, coalesce_max_keys=4, deadline=60
    ) as client:
        held = hold_a_batch(client, timeout=40)
        started = time.monotonic()
        futures = [client.may_exist_future("key:{}".format(i)) for i in range(4)]
        answers = [f.result(timeout=20) for f in futures]
        elapsed = time.monotonic() - started
        assert all(a.may_exist is False for a in answers), answers
        assert elapsed < 5, elapsed
        assert not held.done()
        stats = client.stats()
        assert stats.gate_calls == 2 and stats.batched_keys == 5, stats


def test_window_zero_sends_unary_calls(gate, namespace):
    unary_before = gate.requests("MayExist")
    batches_before = gate.requests("BatchMayExist")
    with GateClient(gate.grpc_addr, namespace, coalesce_window=0, deadline=5) as client:
        client.add(["here"])
        answers = concurrently(16, lambda i: client.may_exist("here" if i % 2 else "gone:{}".format(i)))
        stats = client.stats()
    assert [a.may_exist for a in answers] == [bool(i % 2) for i in range(16)]
    assert stats.gate_calls == stats.lookups == 16
    assert stats.batched_keys == 0
    assert gate.requests("MayExist") - unary_before == 16
    assert gate.requests("BatchMayExist") == batches_before


def test_a_caller_whose_deadline_passes_fails_alone(gate, namespace, black_hole):
    # A batch in flight makes the others wait the window; the impatient caller fails at its own deadline, the
    # others are answered.
    add_keys(gate, namespace, ["k:1"])
    with GateClient([black_hole, gate.grpc_addr], namespace, coalesce_window=0.5, deadline=5) as client:
        hold_a_batch(client, timeout=5)

        def lookup(i):
            started = time.monotonic()
            try:
                return client.may_exist("k:{}".format(i), timeout=0.05 if i == 0 else None)
            except GateError as error:
                return error, time.monotonic() - started

        results = concurrently(6, lookup)
        stats = client.stats()
    error, elapsed = results[0]
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert elapsed < 0.4, elapsed  # at its deadline, not when the batch came back
    assert [r.may_exist for r in results[1:]] == [True, False, False, False, False]
    assert stats.gate_calls == 2
    assert stats.batched_keys == 1 + 5  # the expired lookup was not sent


def test_a_deadline_is_kept_by_the_future_api_too(gate, namespace, black_hole):
    with GateClient([black_hole, gate.grpc_addr], namespace, coalesce_window=0.5, deadline=5) as client:
        hold_a_batch(client, timeout=5)
        impatient = client.may_exist_future("a", timeout=0.05)
        patient = client.may_exist_future("b")
        with pytest.raises(GateError) as failure:
            impatient.result(timeout=0.4)  # failed by the client at its deadline, no waiting caller needed
        assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert patient.result(timeout=5).may_exist is False


def test_a_cancelled_caller_does_not_break_its_batch(gate, namespace, black_hole):
    add_keys(gate, namespace, ["c:1", "c:2"])
    # Cancelled while pending (a batch in flight holds the others for the window): never sent.
    with GateClient([black_hole, gate.grpc_addr], namespace, coalesce_window=0.2, deadline=5) as client:
        hold_a_batch(client, timeout=5)
        futures = [client.may_exist_future("c:{}".format(i)) for i in range(4)]
        assert futures[0].cancel()
        with pytest.raises(cf.CancelledError):
            futures[0].result()
        assert [f.result(timeout=5).may_exist for f in futures[1:]] == [True, True, False]
        assert client.stats().batched_keys == 1 + 3
    # Cancelled at once, whatever state its batch is in (the first lookup leaves at once): the others still
    # get their answers.
    with GateClient(gate.grpc_addr, namespace, coalesce_window=0.2, deadline=5) as client:
        futures = [client.may_exist_future("c:{}".format(i)) for i in range(4)]
        futures[0].cancel()
        futures[3].cancel()
        assert [f.result(timeout=5).may_exist for f in futures[1:3]] == [True, True]
        assert 2 <= client.stats().batched_keys <= 4


def test_a_failed_batch_fails_every_caller_with_its_status(gate):
    with GateClient(gate.grpc_addr, "no_such_namespace", coalesce_window=0.01, deadline=5) as client:
        results = concurrently(8, lambda i: client.may_exist("k:{}".format(i)))
        stats = client.stats()
    assert all(isinstance(r, GateError) for r in results), results
    assert {r.code() for r in results} == {grpc.StatusCode.NOT_FOUND}
    assert len({r.details() for r in results}) == 1
    assert "no_such_namespace" in results[0].details()
    assert stats.gate_calls < 8


@pytest.mark.parametrize("window", [0, 0.01])
def test_invalid_input_keeps_its_status(gate, namespace, window):
    with GateClient(gate.grpc_addr, namespace, coalesce_window=window, deadline=5) as client:
        # An empty key and one over max_key_bytes, looked up alongside good ones, fail alone.
        keys = ["", "x" * 1025, "fine:1", "fine:2"]
        results = concurrently(4, lambda i: client.may_exist(keys[i]))
        assert isinstance(results[0], GateError) and results[0].code() == grpc.StatusCode.INVALID_ARGUMENT
        assert isinstance(results[1], GateError) and results[1].code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "max_key_bytes" in results[1].details()
        assert [r.may_exist for r in results[2:]] == [False, False]
        with pytest.raises(GateError) as failure:
            client.add([])
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert isinstance(failure.value, grpc.RpcError)
        # A part holding such a key is sent on its own: its INVALID_ARGUMENT is its caller's alone.
        batched = client.stats().batched_keys
        with pytest.raises(GateError) as failure:
            client.may_exist_many(["fine:3", ""])
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert client.stats().batched_keys == batched


@pytest.mark.parametrize("window", [0, 0.0002])
def test_may_exist_many_splits_at_the_batch_limit(gate, namespace, window):
    keys = ["many:{}".format(i) for i in range(10_001)]
    add_keys(gate, namespace, keys[::1000])
    # coalesce_max_keys at the limit: when both parts are pending, only the 10,000-key limit keeps them apart.
    with GateClient(gate.grpc_addr, namespace, coalesce_window=window, coalesce_max_keys=10_000, deadline=10) as client:
        answers = client.may_exist_many(keys)
        stats = client.stats()
    assert len(answers) == len(keys)
    for i, answer in enumerate(answers):
        if i % 1000 == 0:
            assert answer.may_exist, i
    assert sum(a.may_exist for a in answers) < 200  # the rest absent, but for a few false positives
    assert len({a.observed_seq for a in answers}) == 1
    assert stats.gate_calls == 2 and stats.lookups == 0
    assert stats.batched_keys == (len(keys) if window else 0)


def test_concurrent_may_exist_many_share_batches(gate, namespace):
    parts = [["part:{}:{}".format(c, i) for i in range(100)] for c in range(10)]
    add_keys(gate, namespace, [k for part in parts for k in part[::3]])
    with GateClient(gate.grpc_addr, namespace, coalesce_window=0, deadline=10) as plain:
        expected = [[a.may_exist for a in plain.may_exist_many(part)] for part in parts]
        assert plain.stats().gate_calls == 10 and plain.stats().batched_keys == 0
    with GateClient(gate.grpc_addr, namespace, coalesce_window=0.05, deadline=10) as client:
        answers = concurrently(10, lambda c: client.may_exist_many(parts[c]))
        stats = client.stats()
    for c, part_answers in enumerate(answers):
        assert not isinstance(part_answers, BaseException), part_answers
        assert [a.may_exist for a in part_answers] == expected[c], c
        assert all(part_answers[i].may_exist for i in range(0, 100, 3))
        assert len({a.observed_seq for a in part_answers}) == 1
    assert stats.batched_keys == 1000 and stats.lookups == 0
    assert stats.gate_calls < 10, stats


def test_single_lookups_and_parts_share_a_batch(gate, namespace, black_hole):
    # Pending together behind a batch in flight, a lookup and a part go out as one call, each answered with its
    # own keys' bits.
    add_keys(gate, namespace, ["mix:one", "mix:b"])
    with GateClient([black_hole, gate.grpc_addr], namespace, coalesce_window=0.2, deadline=5) as client:
        hold_a_batch(client, timeout=5)
        one = client.may_exist_future("mix:one")
        many = cf.ThreadPoolExecutor(1).submit(client.may_exist_many, ["mix:a", "mix:b", "mix:c"])
        other = client.may_exist_future("mix:other")
        assert [a.may_exist for a in many.result(timeout=5)] == [False, True, False]
        assert one.result(timeout=5).may_exist is True
        assert other.result(timeout=5).may_exist is False
        stats = client.stats()
    assert stats.gate_calls == 2 and stats.batched_keys == 1 + 5 and stats.lookups == 3


def test_record_absent_outcomes(gate, namespace):
    with GateClient(gate.grpc_addr, namespace, deadline=5) as client:
        seq = client.add(["known"])
        recorded = client.record_absent("known", AbsenceKind.MISSING, client.may_exist("known").observed_seq)
        assert recorded.outcome == RecordOutcome.RECORDED and recorded.seq > seq and recorded.expires_in_ms > 0
        assert client.may_exist("known").may_exist is False
        assert client.record_absent("never", "missing", seq).outcome == RecordOutcome.REDUNDANT
        stale = client.may_exist("raced").observed_seq
        client.add(["raced"])
        assert client.record_absent("raced", AbsenceKind.DELETED, stale).outcome == RecordOutcome.SUPERSEDED
        with pytest.raises(GateError) as ahead:
            client.record_absent("known", AbsenceKind.MISSING, 1 << 60)
        assert ahead.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_unreachable_gate_is_unavailable(namespace):
    with GateClient(closed_port_address(), namespace, deadline=2) as client:
        for window in (client.may_exist, lambda k: client.may_exist_many([k])):
            with pytest.raises(GateError) as failure:
                window("k")
            assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
        assert client.stats().retries == 0  # one address: nothing to retry on


def test_a_dead_address_is_skipped_round_robin(gate, namespace):
    dead = closed_port_address()
    with GateClient([dead, gate.grpc_addr], namespace, coalesce_window=0, deadline=5) as client:
        client.add(["rr"])  # the first call, to the dead address, is retried on the live one
        answers = [client.may_exist("rr") for _ in range(10)]
        stats = client.stats()
    assert all(a.may_exist and a.address == gate.grpc_addr for a in answers)
    assert stats.retries >= 1
    assert stats.retries <= 2  # the dead address is skipped for a second once it failed


def test_a_silent_address_costs_a_call_half_its_deadline_and_is_then_skipped(gate, namespace, black_hole):
    """A replica that accepts connections and never answers (SIGSTOPped) beside a live one: a call sent to it
    moves on to the live one after half its deadline instead of failing at the deadline, and the silent
    address is then skipped: every lookup is answered, one retry in all."""
    with GateClient([black_hole, gate.grpc_addr], namespace, coalesce_window=0, deadline=0.4) as client:
        answers = [client.may_exist("silent-beside-live") for _ in range(4)]
        stats = client.stats()
    assert all(a.address == gate.grpc_addr for a in answers)
    assert stats.retries == 1


def test_pick_first_sticks_to_the_first_healthy_address(gate, namespace):
    dead = closed_port_address()
    unary_before = gate.requests("MayExist")
    with GateClient([gate.grpc_addr, dead], namespace, coalesce_window=0, address_policy="pick_first") as client:
        for _ in range(10):
            assert client.may_exist("pf").address == gate.grpc_addr
        assert client.stats().retries == 0
    assert gate.requests("MayExist") - unary_before == 10
    with GateClient([dead, gate.grpc_addr], namespace, coalesce_window=0, address_policy="pick_first") as client:
        for _ in range(10):
            assert client.may_exist("pf").address == gate.grpc_addr
        assert client.stats().retries == 1  # once: then the dead address is down for a second


def test_a_coalesced_batch_is_retried_on_another_address(gate, namespace):
    dead = closed_port_address()
    with GateClient([dead, gate.grpc_addr], namespace, coalesce_window=0.01, address_policy="pick_first", deadline=5) as client:
        answers = concurrently(8, lambda i: client.may_exist("b:{}".format(i)))
        assert all(a.may_exist is False for a in answers), answers
        stats = client.stats()
    assert stats.retries >= 1 and stats.gate_calls < 8


def test_asyncio_lookups_share_batches(gate, namespace):
    async def main(client):
        tasks = [asyncio.ensure_future(client.may_exist_async("t:{}".format(i))) for i in range(16)]
        slow = asyncio.ensure_future(client.may_exist_async("cancel-me"))
        await asyncio.sleep(0)
        slow.cancel()
        answers = await asyncio.gather(*tasks)
        with pytest.raises(asyncio.CancelledError):
            await slow
        return answers

    with GateClient(gate.grpc_addr, namespace, coalesce_window=0.02, deadline=5) as client:
        client.add(["t:3"])
        answers = asyncio.run(main(client))
        stats = client.stats()
    assert [a.may_exist for a in answers] == [i == 3 for i in range(16)]
    assert stats.gate_calls < 16


@pytest.mark.parametrize("window", [0.0002, 0], ids=["coalesced", "unary"])
def test_an_asyncio_lookup_of_a_gate_that_never_answers_fails_at_its_deadline(black_hole, window):
    async def main(client):
        # 15 s of asyncio's own patience: a lookup that never fails itself ends as asyncio.TimeoutError.
        with pytest.raises(GateError) as failed:
            await asyncio.wait_for(client.may_exist_async("k", timeout=0.3), 15)
        return failed.value

    with GateClient(black_hole, "users", coalesce_window=window, deadline=3600) as client:
        error = asyncio.run(main(client))
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, error


def test_token_is_sent_as_a_bearer(start_gate):
    binary = os.environ["EXISTENCE_GATE_BIN"]
    digest = subprocess.run(
        [binary, "hash-token", "s3cret"], check=True, capture_output=True, text=True, timeout=30
    ).stdout.strip().split()[-1]
    tokens = '[[tokens]]\nname = "test"\nsha256 = "{}"\nroles = ["read", "write"]\nnamespaces = ["*"]\n\n'.format(digest)
    server = start_gate(["secured"], tokens)
    with GateClient(server.grpc_addr, "secured", deadline=5) as anonymous:
        with pytest.raises(GateError) as failure:
            anonymous.may_exist("k")
        assert failure.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with GateClient(server.grpc_addr, "secured", token="s3cret", deadline=5) as client:
        client.add(["k"])
        assert client.may_exist("k").may_exist
