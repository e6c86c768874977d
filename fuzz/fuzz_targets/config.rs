//! TOML configuration and durations; a configuration that parses serves a few requests.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| existence_gate_fuzz::config(data));
