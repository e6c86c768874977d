//! Prometheus metrics, all named `existence_*`: the recorder that renders them, their descriptions, and the
//! service's own series (calls by RPC and status, shedding, accept and handshake failures, refused writes).
//! The core's per-namespace series are resolved in [`crate::core::metrics`].
//!
//! Handles are resolved once (per RPC and status) and then only incremented: a `counter!` macro call with
//! labels looks the series up in a registry on every use, which would cost more than the call it measures.

use std::sync::OnceLock;
use std::time::Instant;

use metrics::{counter, gauge, histogram, Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::memory::Memory;

/// Latency buckets in seconds, from 5 µs to 1 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005,
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// Seconds a change waited before it was applied elsewhere (the PostgreSQL feed's commit-to-gate lag):
/// milliseconds when all is well, minutes while something was down.
const LAG_BUCKETS: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Installs the process-wide Prometheus recorder (once) and returns the handle that renders it.
pub fn install_recorder() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Suffix("duration_seconds".to_string()),
                    LATENCY_BUCKETS,
                )
                .expect("buckets are non-empty")
                .set_buckets_for_metric(Matcher::Suffix("lag_seconds".to_string()), LAG_BUCKETS)
                .expect("buckets are non-empty")
                .build_recorder();
            let handle = recorder.handle();
            // Fails only if another recorder was installed first (an embedding program's): then ours renders
            // nothing, which is that program's choice.
            let _ = metrics::set_global_recorder(recorder);
            describe();
            handle
        })
        .clone()
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        "existence_answers_total",
        "Answers given, by namespace, answer and basis."
    );
    describe_counter!("existence_keys_added_total", "Keys passed to Add.");
    describe_counter!(
        "existence_filter_false_positives_total",
        "RecordAbsent(MISSING) for keys the filter passed: false positives as clients see them."
    );
    describe_counter!(
        "existence_tombstones_throttled_total",
        "RecordAbsent refused by the tombstone rate."
    );
    describe_counter!(
        "existence_tombstones_evicted_total",
        "Tombstones evicted to make room."
    );
    describe_counter!(
        "existence_requests_total",
        "gRPC requests by rpc and status code."
    );
    describe_counter!(
        "existence_requests_shed_total",
        "gRPC calls refused with RESOURCE_EXHAUSTED by the in-flight limit before decoding."
    );
    describe_counter!(
        "existence_accept_errors_total",
        "Failed accepts by port and reason (emfile, enfile, enobufs, enomem, other), each followed by a backoff."
    );
    describe_counter!(
        "existence_handshakes_failed_total",
        "gRPC connections closed before their HTTP/2 preface, by reason (timeout, closed, tls, error)."
    );
    describe_counter!(
        "existence_resp_commands_total",
        "RESP port commands by command and outcome (ok, error)."
    );
    describe_counter!(
        "existence_resp_connections_refused_total",
        "RESP port connections refused at --resp-max-connections."
    );
    describe_histogram!(
        "existence_request_duration_seconds",
        Unit::Seconds,
        "gRPC handler latency by rpc and status code."
    );
    describe_gauge!("existence_tombstones", "Stored tombstones.");
    describe_gauge!("existence_tombstone_bytes", "Bytes of tombstone tables.");
    describe_gauge!("existence_filter_bytes", "Bytes of live filter windows.");
    describe_gauge!("existence_filter_windows", "Live filter windows.");
    describe_gauge!(
        "existence_filter_layers",
        "Live filter layers (more than windows once one grew)."
    );
    describe_gauge!(
        "existence_filter_keys",
        "Estimated distinct keys in live windows."
    );
    describe_gauge!(
        "existence_filter_estimated_false_positive_rate",
        "False-positive rate expected from the filter's fill."
    );
    describe_gauge!("existence_subscribers", "Open invalidation subscriptions.");
    describe_gauge!("existence_seq", "Latest applied seq.");
    describe_gauge!(
        "existence_writes_refused",
        "1 while writes are refused (the log failed or the disk is full; /readyz says why), else 0."
    );
    describe_gauge!(
        "existence_replay_buffer_bytes",
        "Bytes of recent invalidations kept for resuming subscribers."
    );
    describe_gauge!(
        "existence_resident_bytes",
        Unit::Bytes,
        "The process's resident set size."
    );
    describe_gauge!(
        "existence_memory_bytes",
        Unit::Bytes,
        "The process's memory by part: filters, tombstones, recent_adds, replay_buffers, other_heap, \
         allocator_free (an upper bound on its resident share), program."
    );
}

/// Sets the memory gauges (on each scrape).
pub fn memory(memory: &Memory) {
    gauge!("existence_resident_bytes").set(memory.resident as f64);
    for (part, bytes) in memory.labelled() {
        gauge!("existence_memory_bytes", "part" => part).set(bytes as f64);
    }
}

/// Sets whether writes are refused now.
pub fn writes_refused(refused: bool) {
    gauge!("existence_writes_refused").set(f64::from(u8::from(refused)));
}

/// Publishes how the wall clock stands against the gate's steady clock (`existence_clock_offset_seconds`),
/// and counts and logs a step (`existence_clock_steps_total`): a step changes nothing the gate answers (see
/// [`SteadyClock`](crate::core::clock::SteadyClock)), but an operator wants to know the host's clock moved,
/// and that the gate keeps its own time until it restarts.
pub fn wall_clock(check: crate::core::clock::WallCheck) {
    gauge!("existence_clock_offset_seconds").set(check.offset_ms as f64 / 1000.0);
    if let Some(stepped_ms) = check.stepped_ms {
        counter!("existence_clock_steps_total").increment(1);
        tracing::warn!(
            stepped_ms,
            offset_ms = check.offset_ms,
            "the wall clock stepped; the gate keeps its own time (the wall clock at start, carried by the \
             monotonic clock), so nothing expires early or late because of it; it reads the wall clock \
             again when it restarts"
        );
    }
}

/// Counter of RESP connections closed for missing a deadline: `auth` (not authenticated within the
/// handshake timeout) or `request` (a request unfinished that long).
pub fn resp_deadline_closes(reason: &'static str) -> Counter {
    counter!("existence_resp_deadline_closes_total", "reason" => reason)
}

/// Counter of RESP connections closed because their unfinished request outgrew the port's budget.
pub fn resp_budget_closes() -> Counter {
    counter!("existence_resp_budget_closes_total")
}

/// Counter of calls shed by the in-flight limit (they never reach a handler, so `existence_requests_total`
/// does not see them).
pub fn shed_calls() -> Counter {
    counter!("existence_requests_shed_total")
}

/// Counter of failed accepts on `port` (`grpc` or `http`) for `reason`. Resolved per failure: failures are
/// rare, and the registry lookup is nothing beside the backoff that follows.
pub fn accept_errors(port: &'static str, reason: &'static str) -> Counter {
    counter!("existence_accept_errors_total", "port" => port, "reason" => reason)
}

/// Counter of RESP commands called `command` that ended with `outcome` (`ok` or `error`); a pipelined run
/// of `BF.EXISTS` counts each command.
pub fn resp_commands(command: &'static str, outcome: &'static str) -> Counter {
    counter!("existence_resp_commands_total", "command" => command, "outcome" => outcome)
}

/// Counter of RESP connections refused at the connection limit.
pub fn resp_refused_connections() -> Counter {
    counter!("existence_resp_connections_refused_total")
}

/// Counter of gRPC connections closed before their HTTP/2 preface, for `reason`.
pub fn failed_handshakes(reason: &'static str) -> Counter {
    counter!("existence_handshakes_failed_total", "reason" => reason)
}

/// The RPCs, for labelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rpc {
    MayExist = 0,
    BatchMayExist,
    Add,
    RecordAbsent,
    SubscribeInvalidations,
    CurrentSeq,
}

impl Rpc {
    fn name(self) -> &'static str {
        match self {
            Rpc::MayExist => "MayExist",
            Rpc::BatchMayExist => "BatchMayExist",
            Rpc::Add => "Add",
            Rpc::RecordAbsent => "RecordAbsent",
            Rpc::SubscribeInvalidations => "SubscribeInvalidations",
            Rpc::CurrentSeq => "CurrentSeq",
        }
    }
}

/// `code` if the spec defines it (0..=16), else UNKNOWN (2): how the spec says clients must treat codes
/// outside its range (tonic passes through whatever a handler sets).
fn known_code(code: usize) -> usize {
    if crate::proto::code_name_at(code) == "UNKNOWN" {
        2
    } else {
        code
    }
}

/// Request counters and latency histograms per RPC and status, resolved on first use.
#[derive(Debug, Default)]
pub struct RpcMetrics {
    series: [[OnceLock<(Counter, Histogram)>; 17]; 6],
}

impl RpcMetrics {
    /// Records one finished call of `rpc` that began at `started` and ended with status code `code` (0..=16).
    #[inline]
    pub fn record(&self, rpc: Rpc, code: usize, started: Instant) {
        let rpc_index = rpc as usize;
        let code = known_code(code);
        let (count, latency) = self.series[rpc_index][code].get_or_init(|| {
            let labels = [
                ("rpc", rpc.name()),
                ("code", crate::proto::code_name_at(code)),
            ];
            (
                counter!("existence_requests_total", &labels),
                histogram!("existence_request_duration_seconds", &labels),
            )
        });
        count.increment(1);
        latency.record(started.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_outside_the_spec_are_labelled_unknown() {
        assert_eq!(known_code(16), 16);
        assert_eq!(known_code(0), 0);
        for code in [17, 99, usize::MAX] {
            assert_eq!(known_code(code), 2);
        }
    }
}
