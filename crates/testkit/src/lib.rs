//! The test kit: what the integration suite (`tests/suite`), the benches and the Rust client's tests share
//! to run the gate and what it talks to. A crate of its own rather than source files each target includes
//! by path, so that a helper is compiled once, its imports say what it needs, and a bench runs the very
//! launcher the tests run instead of a copy that drifts. Never published; nothing of the gate depends on it.
//!
//! The suite reaches it as `common` (`tests/suite/common.rs` re-exports it), so its modules read
//! `common::nats::Nats` or, after `use common::*`, `start(config)`. That glob import shadows crates of the
//! same name, so no module here is named after a crate the tests use (hence `http_port`, not `http`).
//!
//! - A gate in this process: [`in_process`] (a server on ephemeral loopback ports, clients of it, a runtime
//!   of its own for a stalled disk), [`http_port`] (`GET` on its HTTP port), [`pki`] (a CA and leaves for TLS),
//!   [`tokens`] (`[[tokens]]` entries).
//! - The binary as a process: [`binary`] (where cargo built it; `serve` on free ports, with fault points),
//!   [`replicas`] (replicas of one stream, stopped, killed and restarted as an operator would), [`feed`]
//!   (`existence-gate feed`), [`ports`] (the flags that put every port on a free loopback port).
//! - What the gate talks to, started for a test and stopped when dropped: [`nats`] (one JetStream server, a
//!   cluster, a cluster behind proxies), [`postgres`] (a throwaway PostgreSQL 15), [`proxy`] (a TCP proxy
//!   that delays, silences or cuts a link), [`faketime`] (a wall clock a test steps under a real process).
//! - [`polyglot`]: the suites written in other languages, run as scripts within a time budget;
//!   [`load_drivers`]: each client library under a steady load, for the balancer tests.
//! - For the benches: [`procs`] (servers as processes, and their CPU and memory from `/proc`), [`drive`]
//!   (closed- and open-loop load), [`keys`] (the load's keys), [`text`] (what reports share).
//!
//! Every wait is on a condition, bounded by [`PATIENCE`]: a loaded machine makes a test slower, never wrong.

use std::path::PathBuf;
use std::time::{Duration, Instant};

pub mod binary;
pub mod drive;
pub mod faketime;
pub mod feed;
pub mod http_port;
pub mod in_process;
pub mod keys;
pub mod load_drivers;
pub mod nats;
pub mod pki;
pub mod polyglot;
pub mod ports;
pub mod postgres;
pub mod procs;
pub mod proxy;
pub mod replicas;
pub mod text;
pub mod tokens;

pub use http_port::{http_get, try_http_get};
#[cfg(feature = "fault-points")]
pub use in_process::ReleaseSyncs;
pub use in_process::{
    channel, client, options, runtime_of_its_own, start, start_manual, start_options, start_with,
    START_MS,
};
pub use keys::pack;
pub use pki::{new_pki, Pki};
pub use ports::free_port;
pub use tokens::token_entry;

/// How long a test waits for something that must happen before it fails: far beyond what a loaded 2-core
/// machine needs, so that only a real failure (never a slow machine) reaches it. Waits end as soon as the
/// condition holds, so a passing run never spends it.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The pause between two looks at a condition.
pub(crate) const POLL_PAUSE: Duration = Duration::from_millis(10);

/// Waits until `condition` yields `Some` and returns it, looking again after a short pause; fails the test,
/// naming `what` it waited for, once `deadline` has passed. Tests wait on the condition they need rather than
/// sleeping for a time that a loaded machine may exceed.
pub async fn wait_until<T>(
    deadline: Duration,
    what: &str,
    mut condition: impl AsyncFnMut() -> Option<T>,
) -> T {
    let give_up = Instant::now() + deadline;
    loop {
        if let Some(value) = condition().await {
            return value;
        }
        assert!(
            Instant::now() < give_up,
            "gave up after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(POLL_PAUSE).await;
    }
}

/// Sends `signal` (e.g. "STOP", "CONT", "KILL") to process `pid`, as an operator's `kill` would.
pub fn send_signal(pid: u32, signal: &str) {
    let sent = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -{signal} {pid}");
}

/// The workspace whose files a test reads (docs, deployment files, scripts): the one holding the package
/// cargo runs the test for (`CARGO_MANIFEST_DIR` at run time: a test binary reused from a shared target folder
/// may have been built in another checkout), else the one this kit was built in (`crates/testkit/../..`).
pub fn workspace_root() -> PathBuf {
    let at_run_time = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    let workspace = at_run_time.and_then(|package| {
        package
            .ancestors()
            .find(|dir| {
                std::fs::read_to_string(dir.join("Cargo.toml"))
                    .is_ok_and(|manifest| manifest.contains("\n[workspace]"))
            })
            .map(std::path::Path::to_path_buf)
    });
    workspace.unwrap_or_else(|| {
        let kit = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        kit.parent()
            .and_then(std::path::Path::parent)
            .expect("the kit is at crates/testkit")
            .to_path_buf()
    })
}
