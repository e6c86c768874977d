//! The trivial tonic server: the gate's generated service trait with handlers that look nothing up. What
//! it costs per call (or per key) is the ceiling any tonic service of this contract can reach on the
//! machine: HTTP/2, protobuf decoding and encoding, and the runtime, with no work of its own.
//!
//! It runs in its own process (this binary re-run as `baseline-server`) with the runtime the gate uses
//! (tokio's default multi-thread runtime, one worker per core), listens on a free loopback port and prints
//! `grpc_addr=HOST:PORT` once it serves.

use std::io::Write;
use std::pin::Pin;

use existence_gate::proto::existence_gate_server::{ExistenceGate, ExistenceGateServer};
use existence_gate::proto::{AddRequest, AddResponse, CurrentSeqRequest, CurrentSeqResponse};
use existence_gate::proto::{
    Answer, Basis, BatchMayExistRequest, BatchMayExistResponse, Invalidation, MayExistRequest,
    MayExistResponse, RecordAbsentRequest, RecordAbsentResponse, RecordOutcome,
    SubscribeInvalidationsRequest,
};
use existence_gate_testkit::procs::{self, Server};
use tokio_stream::Stream;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

/// Handlers that answer without looking anything up.
#[derive(Debug, Default)]
struct Trivial;

/// How many keys a `packed_keys` field holds: the least a handler must decode to size its bitmap (each
/// key's varint length is read, its bytes skipped).
fn count_packed(mut packed: &[u8]) -> Result<usize, Status> {
    let mut keys = 0;
    while !packed.is_empty() {
        let length = prost::encoding::decode_varint(&mut packed)
            .map_err(|_| Status::invalid_argument("malformed packed_keys"))?;
        let length = usize::try_from(length).unwrap_or(usize::MAX);
        if length > packed.len() {
            return Err(Status::invalid_argument("truncated packed_keys"));
        }
        packed = &packed[length..];
        keys += 1;
    }
    Ok(keys)
}

type InvalidationStream = Pin<Box<dyn Stream<Item = Result<Invalidation, Status>> + Send>>;

#[tonic::async_trait]
impl ExistenceGate for Trivial {
    async fn may_exist(
        &self,
        _request: Request<MayExistRequest>,
    ) -> Result<Response<MayExistResponse>, Status> {
        Ok(Response::new(MayExistResponse {
            answer: Answer::Absent as i32,
            basis: Basis::Filter as i32,
            observed_seq: 1,
        }))
    }

    async fn batch_may_exist(
        &self,
        request: Request<BatchMayExistRequest>,
    ) -> Result<Response<BatchMayExistResponse>, Status> {
        let request = request.get_ref();
        let response = if request.packed_keys.is_empty() {
            BatchMayExistResponse {
                answers: vec![Answer::MayExist as i32; request.keys.len()],
                observed_seq: 1,
                may_exist_bitmap: bytes::Bytes::new(),
                warming: false,
                bases: Vec::new(),
            }
        } else {
            let keys = count_packed(&request.packed_keys)?;
            BatchMayExistResponse {
                answers: Vec::new(),
                observed_seq: 1,
                may_exist_bitmap: vec![0u8; keys.div_ceil(8)].into(),
                warming: false,
                bases: Vec::new(),
            }
        };
        Ok(Response::new(response))
    }

    async fn add(&self, _request: Request<AddRequest>) -> Result<Response<AddResponse>, Status> {
        Ok(Response::new(AddResponse {
            seq: 1,
            tombstones_cleared: 0,
        }))
    }

    async fn record_absent(
        &self,
        _request: Request<RecordAbsentRequest>,
    ) -> Result<Response<RecordAbsentResponse>, Status> {
        Ok(Response::new(RecordAbsentResponse {
            outcome: RecordOutcome::Recorded as i32,
            seq: 1,
            expires_in_ms: 60_000,
        }))
    }

    async fn current_seq(
        &self,
        _request: Request<CurrentSeqRequest>,
    ) -> Result<Response<CurrentSeqResponse>, Status> {
        Ok(Response::new(CurrentSeqResponse { seq: 1 }))
    }

    type SubscribeInvalidationsStream = InvalidationStream;

    async fn subscribe_invalidations(
        &self,
        _request: Request<SubscribeInvalidationsRequest>,
    ) -> Result<Response<Self::SubscribeInvalidationsStream>, Status> {
        Err(Status::unimplemented(
            "the trivial server has no invalidations",
        ))
    }
}

/// Starts the trivial tonic server: this binary, re-run with `baseline-server`.
pub fn start() -> Server {
    let exe = std::env::current_exe().expect("the harness knows its own path");
    let mut command = std::process::Command::new(exe);
    command.arg("baseline-server");
    procs::start_serving("trivial tonic", command, &[], None)
}

/// Serves the trivial handlers until killed.
pub fn serve() {
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("bound");
        println!("grpc_addr={addr}");
        std::io::stdout().flush().expect("stdout");
        // The same message limits as the gate's default (16 MiB).
        let service = ExistenceGateServer::new(Trivial)
            .max_decoding_message_size(16 << 20)
            .max_encoding_message_size(16 << 20);
        tonic::transport::Server::builder()
            .add_service(service)
            // Nagle off, as the gate has it: otherwise small trailers wait for delayed ACKs.
            .serve_with_incoming(TcpIncoming::from(listener).with_nodelay(Some(true)))
            .await
            .expect("the trivial server failed");
    });
}
