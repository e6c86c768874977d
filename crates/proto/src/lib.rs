//! The gRPC contract (`proto/existence/v1/existence.proto`): its Rust types and service traits, generated at
//! build time with a vendored `protoc`. A crate of its own so that the service (`crates/service`) and the
//! gate's clients (`cli`, `feed`) share one generated copy.
#![allow(missing_docs, clippy::all)]

tonic::include_proto!("existence.v1");

/// The encoded descriptor set of the contract, served by reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("existence_descriptor");
