//! One namespace's settings: its sizing (expected keys, false-positive rate, windows, retention), its
//! tombstone TTLs and bounds, and what they come to in memory.

use std::time::Duration;

use serde::Deserialize;

use crate::filter::{FilterSpec, Retention, MAX_LAYER_BYTES};
use crate::tombstones::{BUCKET_BYTES, WAYS};

use super::duration::{duration, retention};
use super::ConfigError;

/// The most tombstones one namespace may hold (about 120 GiB of table at 30 bytes each).
pub const MAX_TOMBSTONES: u64 = 1 << 32;

/// Sizing and TTLs of one namespace.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NamespaceSettings {
    /// Live keys the filter is sized for (across the retention).
    pub expected_keys: u64,
    /// Target false-positive rate of a lookup, all live windows together.
    pub false_positive_rate: f64,
    /// How long an added key is kept: `forever` or a duration (`30d`).
    #[serde(deserialize_with = "retention")]
    pub retention: Retention,
    /// Live windows when the retention is finite (at least 2).
    pub windows: u32,
    /// Memory cap of the filter in bytes; default 8x its initial size.
    pub max_filter_bytes: Option<u64>,
    /// TTL of a `MISSING` tombstone when the caller asks for none.
    #[serde(deserialize_with = "duration")]
    pub missing_ttl: Duration,
    /// TTL of a `DELETED` tombstone when the caller asks for none.
    #[serde(deserialize_with = "duration")]
    pub deleted_ttl: Duration,
    /// Longest TTL any tombstone gets.
    #[serde(deserialize_with = "duration")]
    pub max_ttl: Duration,
    /// Fraction by which each TTL is randomly shortened or lengthened, so a wave of absences does not
    /// expire at once.
    pub ttl_jitter: f64,
    /// Most tombstones stored at once.
    pub max_tombstones: u64,
    /// Most tombstones stored per second (token bucket, bursts of one second).
    pub max_tombstone_rate: u64,
}

impl Default for NamespaceSettings {
    fn default() -> Self {
        Self {
            expected_keys: 10_000_000,
            false_positive_rate: 0.01,
            retention: Retention::Forever,
            windows: 8,
            max_filter_bytes: None,
            missing_ttl: Duration::from_secs(60),
            deleted_ttl: Duration::from_secs(600),
            max_ttl: Duration::from_secs(3_600),
            ttl_jitter: 0.1,
            max_tombstones: 1_000_000,
            max_tombstone_rate: 10_000,
        }
    }
}

impl NamespaceSettings {
    /// The filter sizing these settings describe.
    pub fn filter_spec(&self) -> FilterSpec {
        let mut spec = FilterSpec {
            expected_keys: self.expected_keys,
            false_positive_rate: self.false_positive_rate,
            retention: self.retention,
            windows: self.windows,
            max_bytes: 0,
        };
        spec.max_bytes = self.max_filter_bytes.unwrap_or_else(|| {
            spec.initial_bytes()
                .saturating_mul(8)
                .min(MAX_LAYER_BYTES.max(spec.initial_bytes()))
        });
        spec
    }

    /// Bytes this namespace holds at its configured size: its filter at `expected_keys` (every live
    /// window) and a full tombstone table. Growth past `expected_keys` can add up to `max_filter_bytes`.
    pub fn bytes_at_capacity(&self) -> u64 {
        let tombstone_bytes = self
            .max_tombstones
            .saturating_mul(BUCKET_BYTES)
            .div_ceil(WAYS as u64);
        self.filter_spec()
            .initial_bytes()
            .saturating_add(tombstone_bytes)
    }

    /// Checks every field; errors name the field as `namespaces.NAME.FIELD`.
    pub(super) fn validate(&self, name: &str) -> Result<(), ConfigError> {
        let field = |f: &str, problem: String| ConfigError::Invalid {
            field: format!("namespaces.{name}.{f}"),
            problem,
        };
        if self.expected_keys == 0 || self.expected_keys > 1 << 40 {
            return Err(field(
                "expected_keys",
                format!("must be between 1 and 2^40, got {}", self.expected_keys),
            ));
        }
        if !(self.false_positive_rate > 1e-9 && self.false_positive_rate <= 0.5) {
            return Err(field(
                "false_positive_rate",
                format!("must be in (1e-9, 0.5], got {}", self.false_positive_rate),
            ));
        }
        if self.retention != Retention::Forever && !(2..=1024).contains(&self.windows) {
            return Err(field(
                "windows",
                format!(
                    "must be between 2 and 1024 for a finite retention, got {}",
                    self.windows
                ),
            ));
        }
        if let Retention::Millis(ms) = self.retention {
            if !(1_000..=100 * 365 * 86_400_000).contains(&ms) {
                return Err(field(
                    "retention",
                    format!("must be between 1s and 100 years, got {ms}ms"),
                ));
            }
        }
        let initial = self.filter_spec().initial_bytes();
        if initial > MAX_LAYER_BYTES {
            return Err(field(
                "expected_keys",
                format!(
                    "needs a filter of {initial} bytes at false_positive_rate {}, more than the \
                     {MAX_LAYER_BYTES} bytes (256 GiB) one namespace's filter can index; split the keys \
                     into several namespaces",
                    self.false_positive_rate
                ),
            ));
        }
        if let Some(cap) = self.max_filter_bytes {
            if cap > MAX_LAYER_BYTES {
                return Err(field(
                    "max_filter_bytes",
                    format!("must be at most {MAX_LAYER_BYTES} bytes (256 GiB), got {cap}"),
                ));
            }
            if cap < initial {
                return Err(field(
                    "max_filter_bytes",
                    format!(
                        "must be at least the initial filter size of {initial} bytes, got {cap}"
                    ),
                ));
            }
        }
        for (name_of, ttl) in [
            ("missing_ttl", self.missing_ttl),
            ("deleted_ttl", self.deleted_ttl),
            ("max_ttl", self.max_ttl),
        ] {
            if ttl < Duration::from_secs(1) || ttl > Duration::from_secs(365 * 86_400) {
                return Err(field(
                    name_of,
                    format!("must be between 1s and 365d, got {ttl:?}"),
                ));
            }
        }
        if !(0.0..=0.5).contains(&self.ttl_jitter) {
            return Err(field(
                "ttl_jitter",
                format!("must be between 0 and 0.5, got {}", self.ttl_jitter),
            ));
        }
        for (name_of, ttl) in [
            ("missing_ttl", self.missing_ttl),
            ("deleted_ttl", self.deleted_ttl),
        ] {
            if ttl > self.max_ttl {
                return Err(field(
                    name_of,
                    format!(
                        "is {ttl:?}, above max_ttl {:?}: every such tombstone would get max_ttl \
                         instead; lower it or raise max_ttl",
                        self.max_ttl
                    ),
                ));
            }
        }
        if !(1..=MAX_TOMBSTONES).contains(&self.max_tombstones) {
            return Err(field(
                "max_tombstones",
                format!(
                    "must be between 1 and {MAX_TOMBSTONES} (2^32), got {}",
                    self.max_tombstones
                ),
            ));
        }
        if self.max_tombstone_rate == 0 {
            return Err(field(
                "max_tombstone_rate",
                "must be at least 1 per second".to_string(),
            ));
        }
        Ok(())
    }
}
