//! Bytes from a Redis client, as the RESP port reads them.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| existence_gate_fuzz::resp_request(data));
