//! A snapshot file read, restored into a gate and served from.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| existence_gate_fuzz::snapshot(data));
