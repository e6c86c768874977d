//! Configuration: per-namespace sizing and TTLs, and the service-wide request limits, read from a TOML file.
//!
//! ```toml
//! [limits]
//! max_batch_keys = 10000
//!
//! [namespaces.users]
//! expected_keys = 50000000
//! false_positive_rate = 0.01
//! retention = "30d"
//! windows = 8
//! missing_ttl = "60s"
//! ```
//!
//! ```toml
//! [[tokens]]
//! name = "checkout"
//! sha256 = "..."          # existence-gate hash-token <token>
//! roles = ["read", "write"]
//! namespaces = ["users"]  # or ["*"]
//! ```
//!
//! Every field has a default; unknown fields and invalid values are startup errors that name the field.
//! The `default` namespace always exists (a `[namespaces.default]` table tunes it).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::core::filter::{FilterSpec, Retention, MAX_LAYER_BYTES};
use crate::core::tombstones::{BUCKET_BYTES, WAYS};

/// The namespace an empty namespace string means.
pub const DEFAULT_NAMESPACE: &str = "default";
/// Longest namespace name.
const MAX_NAMESPACE_LEN: usize = 128;

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
    fn validate(&self, name: &str) -> Result<(), ConfigError> {
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

/// The largest `max_key_bytes` a configuration may set: no gate accepts a longer key.
pub const MAX_KEY_BYTES_LIMIT: usize = 65_536;

/// Service-wide request limits.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Calls in flight across all connections, counted from the moment the server dispatches them (before
    /// decoding, so calls queued for a busy core count too) until their response is ready; beyond it calls
    /// fail fast with `RESOURCE_EXHAUSTED` instead of queueing without bound. Subscription streams count
    /// while they are being set up; health checks and reflection never count.
    pub max_in_flight: usize,
    /// HTTP/2 streams one connection may have open at once (calls and subscriptions).
    pub max_concurrent_streams: u32,
    /// Open subscriptions per namespace; more get `RESOURCE_EXHAUSTED`.
    pub max_subscribers_per_namespace: usize,
    /// Longest a unary call may run; a client's shorter deadline (`grpc-timeout`) wins.
    #[serde(deserialize_with = "duration")]
    pub request_timeout: Duration,
    /// HTTP/2 ping interval on idle connections (finds dead peers and keeps NATs open).
    #[serde(deserialize_with = "duration")]
    pub keepalive_interval: Duration,
    /// How long an unanswered ping may take before the connection is closed.
    #[serde(deserialize_with = "duration")]
    pub keepalive_timeout: Duration,
    /// How long a new gRPC connection may take to complete its TLS handshake (if any) and send the HTTP/2
    /// preface, and an HTTP-port connection to send a request head (also between requests): keepalive pings
    /// start only once HTTP/2 is up, so without this bound a connection that sends nothing holds a descriptor
    /// forever. `--handshake-timeout` overrides it.
    #[serde(deserialize_with = "duration")]
    pub handshake_timeout: Duration,
    /// Most keys in one `BatchMayExist` or `Add`.
    pub max_batch_keys: usize,
    /// Longest key in bytes.
    pub max_key_bytes: usize,
    /// Bytes of recent invalidations kept per namespace for subscribers that resume by seq; a subscriber
    /// further behind gets a `RESYNC`.
    pub replay_buffer_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_in_flight: 4_096,
            max_concurrent_streams: 256,
            max_subscribers_per_namespace: 1_024,
            request_timeout: Duration::from_secs(30),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(30),
            max_batch_keys: 10_000,
            max_key_bytes: 1_024,
            replay_buffer_bytes: 16 << 20,
        }
    }
}

impl Limits {
    fn validate(&self) -> Result<(), ConfigError> {
        let field = |f: &str, problem: String| ConfigError::Invalid {
            field: format!("limits.{f}"),
            problem,
        };
        if !(1..=1_000_000).contains(&self.max_batch_keys) {
            return Err(field(
                "max_batch_keys",
                format!("must be between 1 and 1000000, got {}", self.max_batch_keys),
            ));
        }
        if !(1..=MAX_KEY_BYTES_LIMIT).contains(&self.max_key_bytes) {
            return Err(field(
                "max_key_bytes",
                format!(
                    "must be between 1 and {MAX_KEY_BYTES_LIMIT}, got {}",
                    self.max_key_bytes
                ),
            ));
        }
        if self.max_in_flight == 0
            || self.max_concurrent_streams == 0
            || self.max_subscribers_per_namespace == 0
        {
            let name = if self.max_in_flight == 0 {
                "max_in_flight"
            } else if self.max_concurrent_streams == 0 {
                "max_concurrent_streams"
            } else {
                "max_subscribers_per_namespace"
            };
            return Err(field(name, "must be at least 1".to_string()));
        }
        for (name, value) in [
            ("request_timeout", self.request_timeout),
            ("keepalive_interval", self.keepalive_interval),
            ("keepalive_timeout", self.keepalive_timeout),
            ("handshake_timeout", self.handshake_timeout),
        ] {
            if value < Duration::from_millis(100) {
                return Err(field(
                    name,
                    format!("must be at least 100ms, got {value:?}"),
                ));
            }
        }
        if self.replay_buffer_bytes < 4_096 {
            return Err(field(
                "replay_buffer_bytes",
                format!("must be at least 4096, got {}", self.replay_buffer_bytes),
            ));
        }
        Ok(())
    }
}

/// The whole configuration: limits and namespaces (always including `default`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateConfig {
    /// Request limits.
    #[serde(default)]
    pub limits: Limits,
    /// Namespaces by name.
    #[serde(default)]
    pub namespaces: BTreeMap<String, NamespaceSettings>,
    /// Bearer tokens (`[[tokens]]`); none = the gate is open to anyone who can reach it.
    #[serde(default)]
    pub tokens: Vec<TokenConfig>,
}

/// A role a token can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Lookups and subscriptions.
    Read,
    /// Add and RecordAbsent.
    Write,
    /// The Admin service.
    Admin,
}

/// One configured token.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// A label for logs (never the token).
    pub name: String,
    /// Hex SHA-256 of the token.
    pub sha256: String,
    /// Roles granted.
    pub roles: Vec<Role>,
    /// Namespaces the roles apply to; `*` for all.
    pub namespaces: Vec<String>,
}

/// Checks every `[[tokens]]` entry; errors name the entry that is invalid. The service's
/// `auth::Authorizer` builds its grants from entries that passed.
pub fn validate_tokens(tokens: &[TokenConfig]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for (i, token) in tokens.iter().enumerate() {
        let where_ = format!("tokens[{i}] ({:?})", token.name);
        let digest = token.digest().ok_or_else(|| {
            format!("{where_}.sha256 must be 64 hex digits (run `existence-gate hash-token`)")
        })?;
        if token.roles.is_empty() {
            return Err(format!(
                "{where_}.roles must name at least one of read, write, admin"
            ));
        }
        if token.namespaces.is_empty() {
            return Err(format!("{where_}.namespaces must list namespaces or \"*\""));
        }
        if !seen.insert(digest) {
            return Err(format!("{where_} repeats the hash of an earlier token"));
        }
    }
    Ok(())
}

impl TokenConfig {
    /// The configured hash as bytes, if it is 64 hex digits.
    pub fn digest(&self) -> Option<[u8; 32]> {
        hex::decode(self.sha256.trim())
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
    }
}

impl Default for GateConfig {
    fn default() -> Self {
        Self::from_toml("").expect("the empty configuration is valid")
    }
}

/// A configuration that cannot be used.
#[derive(Debug)]
pub enum ConfigError {
    /// The TOML is malformed, has an unknown field or a value of the wrong type.
    Parse(String),
    /// A value is out of range.
    Invalid { field: String, problem: String },
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Parse(message) => write!(f, "invalid config: {message}"),
            Self::Invalid { field, problem } => write!(f, "invalid config: {field} {problem}"),
        }
    }
}

impl std::error::Error for ConfigError {}

impl GateConfig {
    /// Parses and validates TOML text.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let mut config: GateConfig =
            toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        config
            .namespaces
            .entry(DEFAULT_NAMESPACE.to_string())
            .or_default();
        config.validate()?;
        Ok(config)
    }

    /// Checks every value; a caller that changes one after parsing (a command-line override) calls it again.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.limits.validate()?;
        validate_tokens(&self.tokens).map_err(|problem| ConfigError::Invalid {
            field: "tokens".to_string(),
            problem,
        })?;
        for (name, settings) in &self.namespaces {
            validate_namespace_name(name)?;
            settings.validate(name)?;
        }
        refuse_look_alike_names(self.namespaces.keys())?;
        Ok(())
    }

    /// Bytes all namespaces hold at their configured sizes (see
    /// [`NamespaceSettings::bytes_at_capacity`]).
    pub fn bytes_at_capacity(&self) -> u64 {
        self.namespaces
            .values()
            .map(NamespaceSettings::bytes_at_capacity)
            .fold(0, u64::saturating_add)
    }

    /// Refuses a configuration whose namespaces would not fit in `memory` bytes at their configured sizes:
    /// better a startup error naming the largest namespace than a server that reports ready, then dies
    /// allocating a filter on its first `Add` (and again on every replay).
    pub fn check_fits(&self, memory: u64) -> Result<(), ConfigError> {
        let needed = self.bytes_at_capacity();
        if needed <= memory {
            return Ok(());
        }
        let (name, largest) = self
            .namespaces
            .iter()
            .max_by_key(|(_, settings)| settings.bytes_at_capacity())
            .expect("default always exists");
        let filter_bytes = largest.filter_spec().initial_bytes();
        let field = if filter_bytes >= largest.bytes_at_capacity() / 2 {
            "expected_keys"
        } else {
            "max_tombstones"
        };
        Err(ConfigError::Invalid {
            field: format!("namespaces.{name}.{field}"),
            problem: format!(
                "makes the namespaces need {needed} bytes at their configured sizes ({name}: {} bytes, \
                 of which {filter_bytes} of filter), more than the {memory} bytes of memory available; \
                 lower expected_keys, false_positive_rate or max_tombstones",
                largest.bytes_at_capacity()
            ),
        })
    }
}

/// Names are case-sensitive, so `Users` and `users` would be two key spaces: a typo away from writing keys
/// where no reader looks. Names that differ only in case are refused.
fn refuse_look_alike_names<'a>(names: impl Iterator<Item = &'a String>) -> Result<(), ConfigError> {
    let mut seen: BTreeMap<String, &str> = BTreeMap::new();
    for name in names {
        if let Some(other) = seen.insert(name.to_ascii_lowercase(), name) {
            return Err(ConfigError::Invalid {
                field: format!("namespaces.{name}"),
                problem: format!(
                    "differs from namespace {other:?} only in case: names are case-sensitive, so these \
                     would be two key spaces; rename one"
                ),
            });
        }
    }
    Ok(())
}

fn validate_namespace_name(name: &str) -> Result<(), ConfigError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAMESPACE_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if valid {
        Ok(())
    } else {
        Err(ConfigError::Invalid {
            field: format!("namespaces.{name:?}"),
            problem: format!(
                "is not a valid name: use 1 to {MAX_NAMESPACE_LEN} of A-Z a-z 0-9 _ - ."
            ),
        })
    }
}

/// Parses `500ms`, `90s`, `10m`, `2h`, `7d` or `1w`.
///
/// ```
/// use existence_gate::core::config::parse_duration;
/// assert_eq!(parse_duration("90s").unwrap().as_secs(), 90);
/// assert_eq!(parse_duration("7d").unwrap().as_secs(), 7 * 86_400);
/// assert!(parse_duration("7 days").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(|| {
        format!("`{text}` has no unit: write it like 500ms, 90s, 10m, 2h, 7d or 1w")
    })?;
    let (number, unit) = text.split_at(split);
    let value: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration like 500ms, 90s, 10m, 2h, 7d or 1w"))?;
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "w" => 604_800_000,
        _ => {
            return Err(format!(
                "`{text}` has unknown unit `{unit}`: use ms, s, m, h, d or w"
            ))
        }
    };
    value
        .checked_mul(unit_ms)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("`{text}` is too long"))
}

fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse_duration(&text).map_err(serde::de::Error::custom)
}

fn retention<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Retention, D::Error> {
    let text = String::deserialize(deserializer)?;
    if text.trim() == "forever" {
        return Ok(Retention::Forever);
    }
    parse_duration(&text)
        .map(|d| Retention::Millis(d.as_millis() as u64))
        .map_err(|e| serde::de::Error::custom(format!("{e}, or `forever`")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_config_has_the_default_namespace_with_documented_defaults() {
        let config = GateConfig::from_toml("").unwrap();
        let default = &config.namespaces[DEFAULT_NAMESPACE];
        assert_eq!(default, &NamespaceSettings::default());
        assert_eq!(default.expected_keys, 10_000_000);
        assert_eq!(config.limits.max_batch_keys, 10_000);
        assert_eq!(config.limits.max_key_bytes, 1_024);
        assert_eq!(config.limits.handshake_timeout, Duration::from_secs(30));
    }

    #[test]
    fn namespaces_and_durations_parse() {
        let config = GateConfig::from_toml(
            r#"
            [limits]
            max_batch_keys = 500
            [namespaces.users]
            retention = "7d"
            windows = 8
            missing_ttl = "90s"
            deleted_ttl = "10m"
            max_ttl = "2h"
            "#,
        )
        .unwrap();
        let users = &config.namespaces["users"];
        assert_eq!(users.retention, Retention::Millis(7 * 86_400_000));
        assert_eq!(users.missing_ttl, Duration::from_secs(90));
        assert_eq!(users.max_ttl, Duration::from_secs(7_200));
        assert_eq!(config.limits.max_batch_keys, 500);
        assert!(config.namespaces.contains_key(DEFAULT_NAMESPACE));
    }

    #[test]
    fn errors_name_the_field() {
        let unknown = GateConfig::from_toml("[namespaces.users]\nexpectd_keys = 5").unwrap_err();
        assert!(unknown.to_string().contains("expectd_keys"), "{unknown}");
        let bad_duration =
            GateConfig::from_toml("[namespaces.users]\nmissing_ttl = \"9x\"").unwrap_err();
        assert!(
            bad_duration.to_string().contains("missing_ttl"),
            "{bad_duration}"
        );
        assert!(
            bad_duration.to_string().contains("unknown unit"),
            "{bad_duration}"
        );
        let bad_rate =
            GateConfig::from_toml("[namespaces.users]\nfalse_positive_rate = 2.0").unwrap_err();
        assert!(
            bad_rate
                .to_string()
                .contains("namespaces.users.false_positive_rate"),
            "{bad_rate}"
        );
        let bad_windows =
            GateConfig::from_toml("[namespaces.users]\nretention = \"1d\"\nwindows = 1")
                .unwrap_err();
        assert!(
            bad_windows.to_string().contains("namespaces.users.windows"),
            "{bad_windows}"
        );
        let bad_name = GateConfig::from_toml("[namespaces.\"a b\"]").unwrap_err();
        assert!(
            bad_name.to_string().contains("not a valid name"),
            "{bad_name}"
        );
        let bad_limit = GateConfig::from_toml("[limits]\nmax_batch_keys = 0").unwrap_err();
        assert!(
            bad_limit.to_string().contains("limits.max_batch_keys"),
            "{bad_limit}"
        );
        let bad_handshake =
            GateConfig::from_toml("[limits]\nhandshake_timeout = \"10ms\"").unwrap_err();
        assert!(
            bad_handshake
                .to_string()
                .contains("limits.handshake_timeout"),
            "{bad_handshake}"
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1w").unwrap(), Duration::from_secs(604_800));
        assert!(parse_duration("10").unwrap_err().contains("no unit"));
        assert!(parse_duration("s").is_err());
    }

    #[test]
    fn the_default_filter_cap_is_eight_times_the_initial_size() {
        let spec = NamespaceSettings::default().filter_spec();
        assert_eq!(spec.max_bytes, spec.initial_bytes() * 8);
    }

    fn refusal(toml: &str) -> String {
        GateConfig::from_toml(toml).unwrap_err().to_string()
    }

    #[test]
    fn sizes_past_what_a_filter_can_index_are_refused_with_the_real_limit() {
        let huge = refusal("[namespaces.users]\nexpected_keys = 1000000000000");
        assert!(
            huge.contains("namespaces.users.expected_keys") && huge.contains("256 GiB"),
            "{huge}"
        );
        let cap = refusal("[namespaces.users]\nmax_filter_bytes = 300000000000");
        assert!(cap.contains("namespaces.users.max_filter_bytes"), "{cap}");
        // The largest sizing that fits keeps its default growth cap within the limit.
        let config =
            GateConfig::from_toml("[namespaces.users]\nexpected_keys = 100000000000").unwrap();
        assert!(config.namespaces["users"].filter_spec().max_bytes <= MAX_LAYER_BYTES);
        let tombstones = refusal("[namespaces.users]\nmax_tombstones = 4611686018427387904");
        assert!(
            tombstones.contains("namespaces.users.max_tombstones") && tombstones.contains("2^32"),
            "{tombstones}"
        );
    }

    #[test]
    fn a_configuration_that_does_not_fit_in_memory_names_the_largest_namespace() {
        let config = GateConfig::from_toml(
            "[namespaces.small]\nexpected_keys = 1000\n[namespaces.big]\nexpected_keys = 10000000000",
        )
        .unwrap();
        let needed = config.bytes_at_capacity();
        assert!(needed > 10_000_000_000, "{needed}");
        config.check_fits(needed).unwrap();
        let refused = config.check_fits(8 << 30).unwrap_err().to_string();
        assert!(
            refused.contains("namespaces.big.expected_keys")
                && refused.contains(&needed.to_string())
                && refused.contains(&(8u64 << 30).to_string()),
            "{refused}"
        );
        let tombstones =
            GateConfig::from_toml("[namespaces.t]\nexpected_keys = 1\nmax_tombstones = 1000000000")
                .unwrap();
        let refused = tombstones.check_fits(1 << 30).unwrap_err().to_string();
        assert!(refused.contains("namespaces.t.max_tombstones"), "{refused}");
    }

    #[test]
    fn default_ttls_above_max_ttl_are_refused() {
        let refused = refusal("[namespaces.users]\nmissing_ttl = \"2h\"\nmax_ttl = \"1h\"");
        assert!(
            refused.contains("namespaces.users.missing_ttl") && refused.contains("max_ttl"),
            "{refused}"
        );
        assert!(refusal("[namespaces.users]\ndeleted_ttl = \"2d\"").contains("deleted_ttl"));
    }

    #[test]
    fn names_that_differ_only_in_case_are_refused() {
        let refused = refusal("[namespaces.Users]\n[namespaces.users]");
        assert!(refused.contains("only in case"), "{refused}");
        assert!(refusal("[namespaces.DEFAULT]").contains("only in case"));
        GateConfig::from_toml("[namespaces.users]\n[namespaces.users-v2]").unwrap();
    }
}
