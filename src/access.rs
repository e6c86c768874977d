//! Admission of gRPC calls: refused while shutting down, shed when too many are in flight, and checked
//! against the caller's bearer token — the checks every RPC of both services makes before any work.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tonic::{Request, Status};

use crate::auth::{Authorizer, Denied, Role, Scope};
use crate::shutdown::Shutdown;

/// The shared admission state of a server.
#[derive(Debug)]
pub struct Access {
    authorizer: Authorizer,
    shutdown: Shutdown,
    in_flight: AtomicUsize,
    max_in_flight: usize,
}

/// One admitted call; dropping it frees its in-flight slot.
#[derive(Debug)]
pub struct Admitted {
    access: Arc<Access>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.access.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The `authorization` metadata of a request, if it is valid text.
pub fn authorization<T>(request: &Request<T>) -> Option<&str> {
    request
        .metadata()
        .get("authorization")
        .and_then(|value| value.to_str().ok())
}

impl Access {
    /// Admission with these tokens, this shutdown signal and at most `max_in_flight` calls at once.
    pub fn new(authorizer: Authorizer, shutdown: Shutdown, max_in_flight: usize) -> Arc<Self> {
        Arc::new(Self {
            authorizer,
            shutdown,
            in_flight: AtomicUsize::new(0),
            max_in_flight,
        })
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
        self: &Arc<Self>,
        request: &Request<T>,
        role: Role,
        scope: Scope<'_>,
    ) -> Result<Admitted, Status> {
        self.admit_with(authorization(request), role, scope)
    }

    /// [`admit`](Self::admit) for an `authorization` value read earlier (a stream names its namespace only
    /// in its first message).
    pub fn admit_with(
        self: &Arc<Self>,
        authorization: Option<&str>,
        role: Role,
        scope: Scope<'_>,
    ) -> Result<Admitted, Status> {
        if self.shutdown.is_triggered() {
            return Err(Status::unavailable(
                "the server is shutting down; retry on another replica",
            ));
        }
        if self.in_flight.fetch_add(1, Ordering::Relaxed) >= self.max_in_flight {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
            return Err(Status::resource_exhausted(format!(
                "the server is overloaded: {} calls in flight is the limit (max_in_flight); retry with backoff",
                self.max_in_flight
            )));
        }
        let admitted = Admitted {
            access: Arc::clone(self),
        };
        match self.authorizer.check(authorization, role, scope) {
            Ok(_) => Ok(admitted),
            Err(Denied::Unauthenticated(reason)) => Err(Status::unauthenticated(reason)),
            Err(Denied::PermissionDenied(reason)) => Err(Status::permission_denied(reason)),
        }
    }
}
