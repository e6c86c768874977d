//! The service-wide request limits (`[limits]`): calls in flight, batch and key sizes, timeouts, buffers.

use std::time::Duration;

use serde::Deserialize;

use super::duration::duration;
use super::ConfigError;

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
    /// Open subscriptions one token holds at once, across namespaces and both ports (with tokens
    /// configured); more get `RESOURCE_EXHAUSTED`, so that no one client takes a namespace's every place.
    pub max_subscriptions_per_token: usize,
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
    /// further behind gets a `RESYNC`. Unset: in proportion to each namespace's filter (see
    /// [`Limits::replay_buffer_bytes_for`]).
    pub replay_buffer_bytes: Option<usize>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_in_flight: 4_096,
            max_concurrent_streams: 256,
            max_subscribers_per_namespace: 1_024,
            max_subscriptions_per_token: 256,
            request_timeout: Duration::from_secs(30),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(30),
            max_batch_keys: 10_000,
            max_key_bytes: 1_024,
            replay_buffer_bytes: None,
        }
    }
}

impl Limits {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
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
        for (name, value) in [
            ("max_in_flight", self.max_in_flight),
            (
                "max_concurrent_streams",
                self.max_concurrent_streams as usize,
            ),
            (
                "max_subscribers_per_namespace",
                self.max_subscribers_per_namespace,
            ),
            (
                "max_subscriptions_per_token",
                self.max_subscriptions_per_token,
            ),
        ] {
            if value == 0 {
                return Err(field(name, "must be at least 1".to_string()));
            }
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
        if let Some(bytes) = self.replay_buffer_bytes.filter(|&b| b < 4_096) {
            return Err(field(
                "replay_buffer_bytes",
                format!("must be at least 4096, got {bytes}"),
            ));
        }
        Ok(())
    }

    /// The replay buffer of a namespace whose filter starts at `filter_bytes`: `replay_buffer_bytes` when
    /// set, else half the filter, at least [`MIN_DEFAULT_REPLAY_BYTES`] and at most
    /// [`MAX_DEFAULT_REPLAY_BYTES`].
    ///
    /// Why half the filter: a filter costs about 1.2 bytes per expected key at 1%, a buffered key its length
    /// plus 4 bytes (plus 128 per `Add`), so half the filter holds the last ~3% of a namespace's expected
    /// keys for 16-byte keys — minutes to hours of `Add`s for a namespace that fills over its retention, and
    /// the 10M-key namespace of docs/performance.md's figures keeps 6 MB instead of a fixed 16 MiB. A fixed
    /// size was both too small for large namespaces and, across many small ones, most of the gate's memory.
    pub fn replay_buffer_bytes_for(&self, filter_bytes: u64) -> usize {
        self.replay_buffer_bytes.unwrap_or_else(|| {
            usize::try_from(filter_bytes / 2)
                .unwrap_or(usize::MAX)
                .clamp(MIN_DEFAULT_REPLAY_BYTES, MAX_DEFAULT_REPLAY_BYTES)
        })
    }
}

/// The least replay buffer a namespace gets by default (about 50,000 16-byte keys).
pub const MIN_DEFAULT_REPLAY_BYTES: usize = 1 << 20;
/// The most replay buffer a namespace gets by default.
pub const MAX_DEFAULT_REPLAY_BYTES: usize = 16 << 20;
