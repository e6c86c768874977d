//! The core's metric series, per namespace: answers by basis, keys added, false positives, throttled and
//! evicted tombstones, and the gauges of a namespace's size. They go through the `metrics` facade, so the core
//! knows nothing of the exporter; the service installs the Prometheus recorder that renders them
//! (`service::metrics`).
//!
//! Handles are resolved once per namespace and then only incremented: a `counter!` macro call with labels looks
//! the series up in a registry on every use, which would cost more than the lookup it measures.

use metrics::{counter, gauge, Counter, Gauge};

use crate::answer::{Answer, Basis, Lookup, NamespaceStats};

/// The metric handles of one namespace.
#[derive(Debug)]
pub struct NamespaceMetrics {
    /// `[absent, may_exist] × [filter, tombstone]`.
    answers: [[Counter; 2]; 2],
    pub(crate) keys_added: Counter,
    pub(crate) false_positives: Counter,
    pub(crate) throttled: Counter,
    pub(crate) tombstones_evicted: Counter,
    tombstones: Gauge,
    tombstone_bytes: Gauge,
    filter_bytes: Gauge,
    filter_windows: Gauge,
    filter_layers: Gauge,
    filter_keys: Gauge,
    filter_false_positive_rate: Gauge,
    seq: Gauge,
    replay_buffer_bytes: Gauge,
    subscribers: Gauge,
}

impl NamespaceMetrics {
    /// Resolves the handles of namespace `name`.
    pub fn new(name: &str) -> Self {
        let ns = name.to_string();
        let answer = |answer: &'static str, basis: &'static str| counter!("existence_answers_total", "namespace" => ns.clone(), "answer" => answer, "basis" => basis);
        let labelled_counter = |metric: &'static str| counter!(metric, "namespace" => ns.clone());
        let labelled_gauge = |metric: &'static str| gauge!(metric, "namespace" => ns.clone());
        Self {
            answers: [
                [answer("absent", "filter"), answer("absent", "tombstone")],
                [
                    answer("may_exist", "filter"),
                    answer("may_exist", "tombstone"),
                ],
            ],
            keys_added: labelled_counter("existence_keys_added_total"),
            false_positives: labelled_counter("existence_filter_false_positives_total"),
            throttled: labelled_counter("existence_tombstones_throttled_total"),
            tombstones_evicted: labelled_counter("existence_tombstones_evicted_total"),
            tombstones: labelled_gauge("existence_tombstones"),
            tombstone_bytes: labelled_gauge("existence_tombstone_bytes"),
            filter_bytes: labelled_gauge("existence_filter_bytes"),
            filter_windows: labelled_gauge("existence_filter_windows"),
            filter_layers: labelled_gauge("existence_filter_layers"),
            filter_keys: labelled_gauge("existence_filter_keys"),
            filter_false_positive_rate: labelled_gauge(
                "existence_filter_estimated_false_positive_rate",
            ),
            seq: labelled_gauge("existence_seq"),
            replay_buffer_bytes: labelled_gauge("existence_replay_buffer_bytes"),
            subscribers: labelled_gauge("existence_subscribers"),
        }
    }

    /// Counts answers from the filter or tombstones (warming answers are counted by the gate): tallied
    /// first, so a batch costs at most four shared-counter updates rather than one per key (each update of
    /// a counter that other cores also update moves its cache line between them).
    #[inline]
    pub fn count_answers(&self, lookups: &[Lookup]) {
        let mut tally = [[0u64; 2]; 2];
        for lookup in lookups {
            let answer = match lookup.answer {
                Answer::Absent => 0,
                Answer::MayExist => 1,
            };
            let basis = match lookup.basis {
                Basis::Tombstone => 1,
                Basis::Filter | Basis::Warming => 0,
            };
            tally[answer][basis] += 1;
        }
        for (counters, counts) in self.answers.iter().zip(tally) {
            for (counter, count) in counters.iter().zip(counts) {
                if count > 0 {
                    counter.increment(count);
                }
            }
        }
    }

    /// Sets the gauges from `stats`.
    pub fn export(&self, stats: &NamespaceStats) {
        self.tombstones.set(stats.tombstones as f64);
        self.tombstone_bytes.set(stats.tombstone_bytes as f64);
        self.filter_bytes.set(stats.filter.bytes as f64);
        self.filter_windows.set(stats.filter.windows as f64);
        self.filter_layers.set(stats.filter.layers as f64);
        self.filter_keys.set(stats.filter.keys as f64);
        self.filter_false_positive_rate
            .set(stats.filter.estimated_false_positive_rate);
        self.seq.set(stats.seq as f64);
        self.replay_buffer_bytes
            .set(stats.replay_buffer_bytes as f64);
        self.subscribers.set(stats.subscribers as f64);
    }
}

/// Counter of fail-open answers given while warming, per namespace.
pub fn warming_answers(namespace: &str) -> Counter {
    counter!("existence_answers_total", "namespace" => namespace.to_string(), "answer" => "may_exist", "basis" => "warming")
}

/// `ABSENT` answers served as `MAY_EXIST` + `WARMING` because a replica held no read lease (they are counted
/// in `existence_answers_total` as the state answered them).
pub fn lease_fail_opens(namespace: &str) -> Counter {
    counter!("existence_lease_fail_open_answers_total", "namespace" => namespace.to_string())
}
