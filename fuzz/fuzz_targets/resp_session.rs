//! A program of `AUTH`, pipelines, Pub/Sub and junk through a whole RESP connection.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| existence_gate_fuzz::resp_session(data));
