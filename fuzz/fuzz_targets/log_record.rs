//! One log record payload, and the frame layer over arbitrary bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| existence_gate_fuzz::log_record(data));
