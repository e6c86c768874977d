//! Several gate addresses (replicas of one deployment): which to call, and retrying `UNAVAILABLE` on the
//! next one within the call's deadline.
//!
//! One lazily connected channel per address. An address that answered `UNAVAILABLE` (tonic's status for a
//! refused or broken connection too), or that did not answer within half of what was left of the call's
//! deadline while another address was up (a stopped process), is skipped for `down_for`; when every
//! address is down, the calls go to the one that went down longest ago, so a recovered deployment is found
//! without a health probe.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status};

use crate::options::{AddressPolicy, ClientOptions, ClientTls};
use crate::proto::existence_gate_client::ExistenceGateClient;
use crate::whole_request::WholeRequests;

/// One address and its channel.
struct Address {
    name: String,
    client: ExistenceGateClient<WholeRequests>,
    /// The channel itself, for streams whose requests do not end (a mirror's).
    channel: Channel,
    /// When it answered `UNAVAILABLE`, while it is skipped.
    down_since: Mutex<Option<Instant>>,
}

/// The addresses of one deployment and the policy that picks among them.
pub struct Endpoints {
    addresses: Vec<Address>,
    policy: AddressPolicy,
    down_for: Duration,
    next: AtomicUsize,
}

/// An address that is not a valid `host:port` (or URI).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidAddress(pub String);

impl std::fmt::Display for InvalidAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::error::Error for InvalidAddress {}

impl Endpoints {
    /// Channels to `addresses` (`host:port`, or a URI with `http://` or `https://`), connected on first
    /// use, picked by `policy`, with `options`' down time and TLS. Must be called within a tokio runtime.
    pub fn new(
        addresses: impl IntoIterator<Item = impl Into<String>>,
        policy: AddressPolicy,
        options: &ClientOptions,
    ) -> Result<Self, InvalidAddress> {
        let addresses = addresses
            .into_iter()
            .map(|name| connect_lazy(name.into(), options.tls.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        if addresses.is_empty() {
            return Err(InvalidAddress("no gate address given".to_string()));
        }
        Ok(Self {
            addresses,
            policy,
            down_for: options.down_for,
            next: AtomicUsize::new(0),
        })
    }

    /// The address at `index`, as given.
    pub fn name(&self, index: usize) -> &str {
        &self.addresses[index].name
    }

    /// The order in which a new call tries the addresses: those up first, from the policy's choice on,
    /// then those down, longest down first.
    pub fn order(&self) -> Vec<usize> {
        let n = self.addresses.len();
        let start = match self.policy {
            AddressPolicy::RoundRobin => self.next.fetch_add(1, Relaxed) % n,
            AddressPolicy::PickFirst => 0,
        };
        let now = Instant::now();
        let mut up = Vec::with_capacity(n);
        let mut down = Vec::new();
        for index in (start..n).chain(0..start) {
            match self.down_since(index, now) {
                None => up.push(index),
                Some(since) => down.push((since, index)),
            }
        }
        down.sort();
        up.extend(down.into_iter().map(|(_, index)| index));
        up
    }

    /// When `index` went down, if it is still skipped at `now`.
    fn down_since(&self, index: usize, now: Instant) -> Option<Instant> {
        let since = *lock(&self.addresses[index].down_since);
        since.filter(|since| now.duration_since(*since) < self.down_for)
    }

    /// The client of the address at `index`.
    pub fn client(&self, index: usize) -> ExistenceGateClient<WholeRequests> {
        self.addresses[index].client.clone()
    }

    /// The channel of the address at `index`, for a stream whose requests go on (see [`WholeRequests`]
    /// for why the calls use another wrapping of it).
    pub fn channel(&self, index: usize) -> Channel {
        self.addresses[index].channel.clone()
    }

    /// Marks `index` down if `status` is `UNAVAILABLE`.
    pub fn mark_if_unavailable(&self, index: usize, status: &Status) {
        if status.code() == Code::Unavailable {
            self.mark(index, true);
        }
    }

    fn mark(&self, index: usize, down: bool) {
        let mut since = lock(&self.addresses[index].down_since);
        *since = down.then(Instant::now);
    }

    /// Runs `call` with the client of each address in [`Endpoints::order`] (or of `first` first) until one
    /// answers with anything but `UNAVAILABLE`, within `deadline` of `since`: the answer and the address that
    /// gave it. `retried` is called each time the call moves on to another address.
    pub async fn call<T, F, Fut>(
        &self,
        first: Option<usize>,
        deadline: Duration,
        since: Instant,
        mut retried: impl FnMut(),
        mut call: F,
    ) -> Result<(T, usize), Status>
    where
        F: FnMut(ExistenceGateClient<WholeRequests>, Duration) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let give_up = since + deadline;
        let mut order = self.order();
        if let Some(first) = first.filter(|i| *i < self.addresses.len()) {
            order.retain(|i| *i != first);
            order.insert(0, first);
        }
        let mut last = None;
        for (attempt, &index) in order.iter().enumerate() {
            let remaining = give_up.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                break;
            }
            if attempt > 0 {
                retried();
            }
            // An address that accepts and never answers (a stopped process) would hold the call to its
            // deadline: while another address is up, it gets half of what remains, then the call moves on and
            // the address is skipped while down. With none up, it gets all of it: a slow replica alone still
            // answers within the deadline.
            let now = Instant::now();
            let last_attempt = !order[attempt + 1..]
                .iter()
                .any(|&other| self.down_since(other, now).is_none());
            let budget = if last_attempt {
                remaining
            } else {
                remaining / 2
            };
            let attempt_ends = Instant::now() + budget;
            let client = self.addresses[index].client.clone();
            let answered = tokio::time::timeout(budget, call(client, budget)).await;
            // tonic's own timer, set from the request's `grpc-timeout`, ends the call as CANCELLED; the gate
            // ends a call it held past its deadline (this attempt's, or its `request_timeout` if shorter) as
            // DEADLINE_EXCEEDED: either way this address gave no answer in time, and the call moves on.
            let timed_out = match &answered {
                Err(_) => true,
                Ok(Err(status)) => {
                    status.code() == Code::DeadlineExceeded
                        || (status.code() == Code::Cancelled && Instant::now() >= attempt_ends)
                }
                Ok(Ok(_)) => false,
            };
            match answered {
                Ok(Ok(answer)) => {
                    self.mark(index, false);
                    return Ok((answer, index));
                }
                Ok(Err(status)) if status.code() == Code::Unavailable => {
                    self.mark(index, true);
                    last = Some(status);
                }
                _ if timed_out && !last_attempt => {
                    self.mark(index, true);
                    last = Some(deadline_exceeded(deadline));
                }
                // The deadline itself passed: that is the answer, whatever an earlier address said.
                _ if timed_out => return Err(deadline_exceeded(deadline)),
                Ok(Err(status)) => return Err(status),
                Err(_) => break,
            }
        }
        Err(last.unwrap_or_else(|| deadline_exceeded(deadline)))
    }
}

/// A lazily connected channel to `name`: TLS when `tls` is set or the address says `https://`.
fn connect_lazy(name: String, tls: Option<&ClientTls>) -> Result<Address, InvalidAddress> {
    let uri = match (name.contains("://"), tls) {
        (true, _) => name.clone(),
        (false, None) => format!("http://{name}"),
        (false, Some(_)) => format!("https://{name}"),
    };
    let mut endpoint = Endpoint::from_shared(uri.clone())
        .map_err(|e| InvalidAddress(format!("gate address {name:?} is not host:port: {e}")))?
        .tcp_nodelay(true);
    if uri.starts_with("https://") {
        let config = tls_config(tls.cloned().unwrap_or_default());
        endpoint = endpoint
            .tls_config(config)
            .map_err(|e| InvalidAddress(format!("TLS to gate address {name:?}: {e}")))?;
    }
    let channel = endpoint.connect_lazy();
    Ok(Address {
        name,
        client: ExistenceGateClient::new(WholeRequests(channel.clone())),
        channel,
        down_since: Mutex::new(None),
    })
}

/// tonic's TLS settings for `tls`.
fn tls_config(tls: ClientTls) -> ClientTlsConfig {
    let mut config = ClientTlsConfig::new();
    config = match tls.ca_pem {
        Some(ca) => config.ca_certificate(Certificate::from_pem(ca)),
        None => config.with_webpki_roots(),
    };
    if let Some(domain) = tls.domain {
        config = config.domain_name(domain);
    }
    if let Some((cert, key)) = tls.identity {
        config = config.identity(Identity::from_pem(cert, key));
    }
    config
}

/// Locks `mutex`; a panic elsewhere while it was held leaves nothing half-written here.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The status of a call that no gate answered within the client's `deadline`.
pub(crate) fn deadline_exceeded(deadline: Duration) -> Status {
    Status::deadline_exceeded(format!(
        "the gate did not answer within the client's deadline of {deadline:?}"
    ))
}
