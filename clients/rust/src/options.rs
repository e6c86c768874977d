//! What a caller sets, with the defaults every language's client shares (`clients/README.md`).

use std::time::Duration;

/// How a call picks among several gate addresses (replicas of one deployment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AddressPolicy {
    /// Each call or batch goes to the next address: the load spreads over every replica.
    #[default]
    RoundRobin,
    /// Every call goes to the first address that is up: one replica serves, the others stand by.
    PickFirst,
}

/// The [`crate::GateClient`]'s options.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// The key space; `""` is the gate's `default`.
    pub namespace: String,
    /// How long a single-key lookup waits for others to share its batch. Zero turns coalescing off: each
    /// lookup is a unary `MayExist`. Default 200 µs: below the 1 ms of added p99 a caller notices, and
    /// enough for 64 busy callers to share one call.
    pub coalesce_window: Duration,
    /// A batch is sent as soon as it holds this many keys. Default 1,024: 100-key batches coalesced four
    /// times as wide cost 0.117 instead of 0.179 µs of server CPU per key (`benches/results/callers.md`).
    pub coalesce_max_keys: usize,
    /// Keys longer than this (the gate's `max_key_bytes`, default 1,024) or empty are not coalesced but sent
    /// alone, so the gate's `INVALID_ARGUMENT` answers that caller and not the batch it would share.
    pub max_key_bytes: usize,
    /// Each call's deadline, retries on other addresses included. Default 500 ms.
    pub deadline: Duration,
    /// How calls pick an address.
    pub address_policy: AddressPolicy,
    /// How long an address that answered `UNAVAILABLE` (or could not be reached) is skipped. Default 1 s.
    pub down_for: Duration,
    /// Sent as `authorization: Bearer <token>` when set.
    pub token: Option<String>,
    /// TLS to every address (an `https://` address uses TLS with the defaults too).
    pub tls: Option<ClientTls>,
}

/// TLS to the gate: whom to trust, which name to expect, and a client certificate for mutual TLS.
#[derive(Debug, Clone, Default)]
pub struct ClientTls {
    /// PEM CA bundle that signed the gate's certificate; `None` trusts the webpki (Mozilla) roots.
    pub ca_pem: Option<String>,
    /// The name the gate's certificate must carry; `None` takes the address's host.
    pub domain: Option<String>,
    /// PEM certificate chain and private key, for a gate that requires client certificates.
    pub identity: Option<(String, String)>,
}

impl ClientOptions {
    /// The defaults, for `namespace`.
    pub fn namespace(namespace: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            ..Self::default()
        }
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            namespace: String::new(),
            coalesce_window: Duration::from_micros(200),
            coalesce_max_keys: 1_024,
            max_key_bytes: 1024,
            deadline: Duration::from_millis(500),
            address_policy: AddressPolicy::RoundRobin,
            down_for: Duration::from_secs(1),
            token: None,
            tls: None,
        }
    }
}

/// The [`crate::GatedReader`]'s options.
#[derive(Debug, Clone)]
pub struct ReaderOptions {
    /// Local absences kept (least recently used evicted first). Default 100,000.
    pub cache_capacity: usize,
    /// How long a local absence is trusted. Default 5 s: the invalidation stream drops a stale one sooner;
    /// the TTL bounds the harm when the stream itself is behind.
    pub cache_ttl: Duration,
    /// Keep `SubscribeInvalidations` open. Off: no local cache at all (nothing would keep it true).
    pub subscribe: bool,
}

impl Default for ReaderOptions {
    fn default() -> Self {
        Self {
            cache_capacity: 100_000,
            cache_ttl: Duration::from_secs(5),
            subscribe: true,
        }
    }
}
