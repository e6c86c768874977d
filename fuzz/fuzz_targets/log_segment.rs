//! A whole write-ahead log segment replayed into a gate, as recovery does.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| existence_gate_fuzz::log_segment(data));
