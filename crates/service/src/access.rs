//! Admission of gRPC calls: shed when too many are in flight, refused while shutting down, and checked
//! against the caller's bearer token — the checks every RPC of both services makes before any work.
//!
//! The in-flight limit is a tower layer ([`InFlightLimitLayer`]) in front of the services rather than a
//! check in each handler: it counts a call from the moment the server dispatches it, before its message is
//! decoded, so calls waiting for a worker thread count too. A check made inside a synchronous handler sees
//! only the calls running at that instant (at most one per worker thread), so it never sheds reads however
//! deep the queue in front of the workers grows, and every queued call waits its turn.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use metrics::Counter;
use tonic::codegen::http;
use tonic::{Request, Status};
use tower::{Layer, Service};

use crate::auth::{Authorizer, Denied, Role, Scope};
use crate::shutdown::Shutdown;
use crate::subscriptions::{Held, SubscriptionQuota};

/// The shared admission state of a server: tokens and the shutdown signal.
#[derive(Debug)]
pub struct Access {
    authorizer: Authorizer,
    shutdown: Shutdown,
    subscriptions: Arc<SubscriptionQuota>,
}

/// The `authorization` metadata of a request, if it is valid text.
pub fn authorization<T>(request: &Request<T>) -> Option<&str> {
    request
        .metadata()
        .get("authorization")
        .and_then(|value| value.to_str().ok())
}

impl Access {
    /// Admission with these tokens and this shutdown signal, each token holding at most
    /// `max_subscriptions_per_token` subscriptions.
    pub fn new(
        authorizer: Authorizer,
        shutdown: Shutdown,
        max_subscriptions_per_token: usize,
    ) -> Arc<Self> {
        Arc::new(Self {
            authorizer,
            shutdown,
            subscriptions: SubscriptionQuota::new(max_subscriptions_per_token),
        })
    }

    /// Counts a subscription against the token in `authorization` (none is counted without tokens
    /// configured), or says why not (see [`subscriptions`](crate::subscriptions)).
    pub fn hold_subscription(&self, authorization: Option<&str>) -> Result<Option<Held>, String> {
        if !self.authorizer.is_enabled() {
            return Ok(None);
        }
        let token = self
            .authorizer
            .token_name(authorization)
            .map_err(|denied| match denied {
                Denied::Unauthenticated(reason) => reason.to_string(),
                Denied::PermissionDenied(reason) => reason,
            })?;
        self.subscriptions.hold(token).map(Some)
    }

    /// The token checker.
    pub fn authorizer(&self) -> &Authorizer {
        &self.authorizer
    }

    /// The shutdown signal.
    pub fn shutdown(&self) -> &Shutdown {
        &self.shutdown
    }

    /// Admits a call needing `role` in `scope`, or says why not.
    pub fn admit<T>(
        &self,
        request: &Request<T>,
        role: Role,
        scope: Scope<'_>,
    ) -> Result<(), Status> {
        self.admit_with(authorization(request), role, scope)
    }

    /// [`admit`](Self::admit) for an `authorization` value read earlier (a stream names its namespace only
    /// in its first message).
    pub fn admit_with(
        &self,
        authorization: Option<&str>,
        role: Role,
        scope: Scope<'_>,
    ) -> Result<(), Status> {
        self.check(authorization, role, scope)
            .map_err(|refused| match refused {
                Refused::ShuttingDown => Status::unavailable(SHUTTING_DOWN),
                Refused::Denied(Denied::Unauthenticated(reason)) => Status::unauthenticated(reason),
                Refused::Denied(Denied::PermissionDenied(reason)) => {
                    Status::permission_denied(reason)
                }
            })
    }

    /// The admission rules of every port (gRPC, RESP), each mapping the refusal to its own errors: refused
    /// while shutting down, then checked against the caller's token.
    pub fn check(
        &self,
        authorization: Option<&str>,
        role: Role,
        scope: Scope<'_>,
    ) -> Result<(), Refused> {
        if self.shutdown.is_triggered() {
            return Err(Refused::ShuttingDown);
        }
        self.authorizer
            .check(authorization, role, scope)
            .map(drop)
            .map_err(Refused::Denied)
    }
}

/// What a refusal says while the server shuts down.
pub const SHUTTING_DOWN: &str = "the server is shutting down; retry on another replica";

/// Why [`Access::check`] refused a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Shutdown has begun: the caller should go to another replica.
    ShuttingDown,
    /// The token does not allow it.
    Denied(Denied),
}

/// Paths the in-flight limit never sheds: load balancers' health checks and tooling's reflection must be
/// answered precisely when the server is overloaded.
const EXEMPT_PREFIXES: [&str; 2] = ["/grpc.health.", "/grpc.reflection."];

/// The count of admitted calls and its bound.
#[derive(Debug)]
struct InFlight {
    count: AtomicUsize,
    max: usize,
    shed: Counter,
}

/// One admitted call's share of the count; dropping it (the response is ready, or the call was
/// abandoned) frees it.
struct Slot(Arc<InFlight>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::Relaxed);
    }
}

impl InFlight {
    fn try_acquire(self: &Arc<Self>) -> Option<Slot> {
        if self.count.fetch_add(1, Ordering::Relaxed) >= self.max {
            self.count.fetch_sub(1, Ordering::Relaxed);
            self.shed.increment(1);
            return None;
        }
        Some(Slot(Arc::clone(self)))
    }

    fn refusal(&self) -> Status {
        Status::resource_exhausted(format!(
            "the server is overloaded: {} calls in flight is the limit (max_in_flight); retry with backoff",
            self.max
        ))
    }
}

/// Sheds calls beyond `max_in_flight` at once with `RESOURCE_EXHAUSTED`, before decoding them.
#[derive(Debug, Clone)]
pub struct InFlightLimitLayer {
    in_flight: Arc<InFlight>,
}

impl InFlightLimitLayer {
    /// A limit of `max_in_flight` calls across every connection.
    pub fn new(max_in_flight: usize) -> Self {
        Self {
            in_flight: Arc::new(InFlight {
                count: AtomicUsize::new(0),
                max: max_in_flight,
                shed: crate::metrics::shed_calls(),
            }),
        }
    }
}

impl<S> Layer<S> for InFlightLimitLayer {
    type Service = InFlightLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlightLimit {
            inner,
            in_flight: Arc::clone(&self.in_flight),
        }
    }
}

/// The service of [`InFlightLimitLayer`].
#[derive(Debug, Clone)]
pub struct InFlightLimit<S> {
    inner: S,
    in_flight: Arc<InFlight>,
}

/// A response as the gRPC server's layers see it.
pub type GrpcResponse = http::Response<tonic::body::Body>;

impl<S, B> Service<http::Request<B>> for InFlightLimit<S>
where
    S: Service<http::Request<B>, Response = GrpcResponse>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = GrpcResponse;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<GrpcResponse, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let path = request.uri().path();
        if EXEMPT_PREFIXES
            .iter()
            .any(|prefix| path.starts_with(prefix))
        {
            return Box::pin(self.inner.call(request));
        }
        match self.in_flight.try_acquire() {
            Some(slot) => {
                let response = self.inner.call(request);
                Box::pin(async move {
                    let _slot = slot;
                    response.await
                })
            }
            None => {
                let refusal = self.in_flight.refusal().into_http();
                Box::pin(std::future::ready(Ok(refusal)))
            }
        }
    }
}
