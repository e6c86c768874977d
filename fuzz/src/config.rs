//! The `config` target: the TOML configuration and durations, and a gate built from what parses.

use std::sync::Arc;

use bytes::Bytes;
use existence_gate::core::clock::ManualClock;
use existence_gate::core::config::{parse_duration, GateConfig};
use existence_gate::core::filter::Retention;
use existence_gate::core::gate::Gate;
use existence_gate::core::hashing::KeyHasher;
use existence_gate::core::log::VolatileLog;
use existence_gate::core::namespace::{AbsenceReport, RecordOutcome};
use existence_gate::core::tombstones::AbsenceKind;

use crate::shared::{SEED, START_MS};

/// Parses `data` (lossily as UTF-8) as a configuration and as durations; for a configuration that parses,
/// derives every namespace's sizing and, when it is small enough to allocate, serves a few requests with
/// it (a configuration that validation accepts must not make requests panic).
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = parse_duration(&text);
    for word in text.split(|c: char| c.is_whitespace() || c == '"' || c == '=') {
        if let Ok(duration) = parse_duration(word) {
            assert!(word.trim().starts_with(|c: char| c.is_ascii_digit()));
            let _ = duration.as_millis();
        }
    }
    let config = match GateConfig::from_toml(&text) {
        Ok(config) => config,
        Err(error) => {
            let _ = error.to_string();
            return;
        }
    };
    assert!(config.namespaces.contains_key("default"));
    let mut total_bytes = 0u64;
    for settings in config.namespaces.values() {
        let spec = settings.filter_spec();
        let _ = (spec.fingerprint(), spec.span_ms(), spec.base_geometry());
        let initial = spec.initial_bytes();
        assert!(
            spec.max_bytes >= initial,
            "the filter cap is below its initial size"
        );
        total_bytes = total_bytes.saturating_add(initial);
        if let Retention::Millis(ms) = spec.retention {
            assert!(ms >= 1_000);
        }
    }
    if total_bytes > 1 << 20 || config.namespaces.len() > 4 {
        return;
    }
    let clock = Arc::new(ManualClock::new(START_MS));
    let gate = Gate::new(&config, KeyHasher::from_seed(SEED), clock.clone());
    gate.open(Arc::new(VolatileLog));
    for name in config.namespaces.keys() {
        let key = Bytes::from_static(b"k");
        gate.add(name, vec![key.clone()]).expect("a valid add");
        for (kind, ttl_seconds) in [
            (AbsenceKind::Missing, 0),
            (AbsenceKind::Deleted, 0),
            (AbsenceKind::Missing, u32::MAX),
        ] {
            let report = AbsenceReport {
                key: key.clone(),
                kind,
                observed_seq: 0,
                ttl_seconds,
            };
            let recorded = gate.record_absent(name, report).expect("a valid report");
            if recorded.outcome == RecordOutcome::Recorded {
                let max_ttl = config.namespaces[name].max_ttl.as_millis();
                assert!(u128::from(recorded.expires_in_ms) <= max_ttl.max(1));
            }
        }
        let _ = gate.may_exist(name, &key).expect("a valid lookup");
        clock.advance(61_000);
        gate.maintain();
    }
    let _ = gate.stats();
}
