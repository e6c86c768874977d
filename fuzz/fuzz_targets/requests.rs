//! A program of typed and protobuf-encoded requests against a gate.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| existence_gate_fuzz::requests(data));
