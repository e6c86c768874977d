//! The `Add` method served from its wire form ([`AddKeys`]: the keys read straight into one buffer), in
//! front of the generated server, under the same message size limit and, like it, without compression;
//! every other method goes to the generated server.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::codegen::{http, Body, StdError};
use tonic::server::{NamedService, UnaryService};
use tonic::{Request, Response, Status};

use crate::grpc::GateService;
use crate::proto;
use crate::proto::existence_gate_server::{ExistenceGateServer, SERVICE_NAME};
use crate::request_keys::AddKeys;

/// The `Add` method's path.
const ADD_PATH: &str = "/existence.v1.ExistenceGate/Add";

/// The generated server with `Add` served from [`AddKeys`].
#[derive(Debug, Clone)]
pub struct AddRoute {
    inner: ExistenceGateServer<GateService>,
    service: GateService,
    max_message_bytes: usize,
}

impl AddRoute {
    /// `service` behind the generated server, both with `max_message_bytes` as the largest message
    /// decoded or encoded.
    pub fn new(service: GateService, max_message_bytes: usize) -> Self {
        let inner = ExistenceGateServer::new(service.clone())
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes);
        Self {
            inner,
            service,
            max_message_bytes,
        }
    }
}

impl NamedService for AddRoute {
    const NAME: &'static str = SERVICE_NAME;
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, Infallible>> + Send + 'static>>;

impl<B> tower::Service<http::Request<B>> for AddRoute
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != ADD_PATH {
            return self.inner.call(request);
        }
        let method = AddMethod(self.service.clone());
        let max = Some(self.max_message_bytes);
        Box::pin(async move {
            let codec = tonic_prost::ProstCodec::<proto::AddResponse, AddKeys>::default();
            let mut grpc = tonic::server::Grpc::new(codec)
                // As the generated server is set up here: no compressed messages either way.
                .apply_compression_config(Default::default(), Default::default())
                .apply_max_message_size_config(max, max);
            Ok(grpc.unary(method, request).await)
        })
    }
}

struct AddMethod(GateService);

impl UnaryService<AddKeys> for AddMethod {
    type Response = proto::AddResponse;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Self::Response>, Status>> + Send>>;

    fn call(&mut self, request: Request<AddKeys>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.add_keys(request).await })
    }
}
