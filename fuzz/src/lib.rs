//! The checks behind every fuzz target, one module per target. The targets (`fuzz_targets/*.rs`) call them
//! under libFuzzer; the main crate's suite (`tests/suite/fuzz_harnesses.rs`) depends on this library and
//! runs the same checks on every committed corpus file and on proptest-generated inputs, so that `cargo fuzz`
//! and plain `cargo test` run exactly the same code on their inputs.
//!
//! Each check takes arbitrary bytes, feeds them to one decoder or request path, and panics only when the
//! code under test panics or breaks a stated property (a decoded record re-encodes to the same bytes, an
//! added key answers `MAY_EXIST`, a snapshot read back equals what was written, ...). Errors are expected
//! answers to hostile input, never findings.
//!
//! Frames carry CRC-32C checksums, so nearly every mutation of a log segment or snapshot is refused at the
//! frame layer. The segment and snapshot checks therefore run each input twice: as it is, and with every
//! frame's checksum recomputed ([`fix_checksums`]), which lets mutations reach the record and snapshot
//! decoders behind the frames and the recovery code behind those.
//!
//! | Target | Module | Feeds |
//! | --- | --- | --- |
//! | `log_record` | [`mod@log_record`] | one log record's payload; the frame layer over the same bytes |
//! | `log_segment` | [`mod@log_segment`] | whole segment files replayed into a gate, as recovery does |
//! | `snapshot` | [`mod@snapshot`] | a snapshot file read, restored, served from and written back |
//! | `config` | [`mod@config`] | the TOML configuration and durations; a gate built from what parses |
//! | `requests` | [`mod@requests`] | a program of typed and protobuf-encoded requests against a gate |
//! | `resp_request` | [`mod@resp_request`] | a Redis client's bytes through the RESP port's request reader |
//! | `resp_session` | [`mod@resp_session`] | a program of `AUTH`, pipelines, Pub/Sub and junk through a whole RESP connection |
//!
//! Beside them: [`shared`] (the gates' configurations, scratch directories, checksums) and [`seeds`]
//! (realistic inputs for each target, made by the code paths the server uses).
//!
//! libFuzzer is an optional dependency (the `libfuzzer` feature, on by default, which `cargo fuzz` builds
//! with): the suite takes the checks without it, so `cargo test` never compiles libFuzzer's C++.

pub mod config;
pub mod log_record;
pub mod log_segment;
pub mod requests;
pub mod resp_request;
pub mod resp_session;
pub mod seeds;
pub mod shared;
pub mod snapshot;

pub use config::config;
pub use log_record::log_record;
pub use log_segment::{log_segment, seed_fingerprint};
pub use requests::requests;
pub use resp_request::resp_request;
pub use resp_session::resp_session;
pub use seeds::seeds;
pub use shared::{fix_checksums, new_gate, parsed, scratch, CONFIG, EDGE_CONFIG, SEED, START_MS};
pub use snapshot::{
    read_snapshot, snapshot, ImageSummary, LayerSummary, NamespaceSummary, WindowSummary,
};

/// The fuzz targets, as named under `fuzz/fuzz_targets/` and `fuzz/corpus/`.
pub const TARGETS: [&str; 7] = [
    "log_record",
    "log_segment",
    "snapshot",
    "config",
    "requests",
    "resp_request",
    "resp_session",
];

/// Runs the check of `target` on `data`.
pub fn check(target: &str, data: &[u8]) {
    match target {
        "log_record" => log_record(data),
        "log_segment" => log_segment(data),
        "snapshot" => snapshot(data),
        "config" => config(data),
        "requests" => requests(data),
        "resp_request" => resp_request(data),
        "resp_session" => resp_session(data),
        other => panic!("no target {other}"),
    }
}
