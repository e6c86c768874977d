//! `[mirrors]`: client libraries' in-process copies of namespaces' filters, and the sub-leases under which
//! they answer `ABSENT` without a call ([`crate::sublease`]).

use std::time::Duration;

use serde::Deserialize;

use super::duration::duration;
use super::ConfigError;
use crate::sublease::Terms;

/// The margin taken off every sub-lease for how clocks are read: the gate reads `Instant`s to the
/// nanosecond, so this only needs to cover the two readings' order within one process's scheduler.
const SUBLEASE_MARGIN: Duration = Duration::from_millis(1);

/// Mirrors and their sub-leases.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Mirrors {
    /// Mirrors one namespace may have attached at once; more get `RESOURCE_EXHAUSTED`. 0, the default,
    /// turns mirrors off (`FAILED_PRECONDITION`). Each attached mirror holds a copy of the filter while it
    /// downloads, and every `Add` waits for its acknowledgement (or its sub-lease to end).
    pub max_per_namespace: usize,
    /// The longest sub-lease the gate grants: how long a mirror that stops answering (paused, cut off)
    /// can delay `Add`s, and how long `Add`s wait after the gate starts (a mirror of its previous
    /// incarnation may still hold one).
    #[serde(deserialize_with = "duration")]
    pub sublease: Duration,
    /// ρ, in parts per million: how much faster a client's monotonic clock may run than the gate's.
    pub max_clock_drift_ppm: u64,
}

impl Default for Mirrors {
    fn default() -> Self {
        Self {
            max_per_namespace: 0,
            sublease: Duration::from_secs(1),
            max_clock_drift_ppm: 10_000,
        }
    }
}

impl Mirrors {
    /// Whether mirrors may attach.
    pub fn enabled(&self) -> bool {
        self.max_per_namespace > 0
    }

    /// The terms of every sub-lease granted.
    pub fn terms(&self) -> Terms {
        Terms {
            length: self.sublease.as_nanos() as u64,
            drift_ppm: self.max_clock_drift_ppm,
            margin: SUBLEASE_MARGIN.as_nanos() as u64,
        }
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let field = |f: &str, problem: String| ConfigError::Invalid {
            field: format!("mirrors.{f}"),
            problem,
        };
        if self.max_per_namespace > 10_000 {
            return Err(field(
                "max_per_namespace",
                format!("must be at most 10000, got {}", self.max_per_namespace),
            ));
        }
        if !(Duration::from_millis(50)..=Duration::from_secs(60)).contains(&self.sublease) {
            return Err(field(
                "sublease",
                format!("must be between 50ms and 60s, got {:?}", self.sublease),
            ));
        }
        if self.max_clock_drift_ppm >= 500_000 {
            return Err(field(
                "max_clock_drift_ppm",
                format!(
                    "must be below 500000 (50%), got {}",
                    self.max_clock_drift_ppm
                ),
            ));
        }
        Ok(())
    }
}
