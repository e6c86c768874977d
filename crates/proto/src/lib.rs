//! The gRPC contract (`proto/existence/v1/existence.proto`): its Rust types and service traits, generated at
//! build time with a vendored `protoc`. A crate of its own so that the service (`crates/service`) and the
//! gate's clients (`cli`, `feed`) share one generated copy.
#![allow(missing_docs, clippy::all)]

tonic::include_proto!("existence.v1");

/// The encoded descriptor set of the contract, served by reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("existence_descriptor");

/// gRPC status codes 0..=16 by the spec's names.
const CODE_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// The spec's name of status `code` (`UNAUTHENTICATED`), as metric labels and the command-line tools' error
/// lines spell it: one table, here with the contract, for the service and its clients alike.
pub fn code_name(code: tonic::Code) -> &'static str {
    code_name_at(code as usize)
}

/// [`code_name`] of a raw code; codes outside the spec (0..=16) are `UNKNOWN`, as the spec says clients must
/// treat them (tonic passes through whatever a handler sets).
pub fn code_name_at(code: usize) -> &'static str {
    CODE_NAMES.get(code).copied().unwrap_or("UNKNOWN")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_named_as_the_spec_names_them_and_others_are_unknown() {
        assert_eq!(code_name(tonic::Code::InvalidArgument), "INVALID_ARGUMENT");
        assert_eq!(code_name_at(16), "UNAUTHENTICATED");
        assert_eq!(code_name_at(0), "OK");
        for code in [17, 99, usize::MAX] {
            assert_eq!(code_name_at(code), "UNKNOWN");
        }
    }
}
