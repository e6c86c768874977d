//! The polyglot interop suite as cargo tests: for each of Java, Go, Python and Node, `tests/interop/run.sh`
//! starts the binary built by this `cargo test`, generates that language's stubs from `proto/`, and runs the
//! shared scenario client (`tests/interop/LANG/`) and the read-path example (`examples/LANG/`) against it,
//! besides the load-balancer checks (`existence-gate probe`, `/healthz`, `/readyz`, SIGTERM).
//!
//! A language whose toolchain is missing is SKIPPED with a loud message and passes, unless
//! `EXISTENCE_GATE_REQUIRE_INTEROP=1` (as in CI), where it fails. `.ci/install-interop` installs them all.

use crate::common;

use common::polyglot::run_suite;

fn interop(lang: &str) {
    run_suite(&format!("interop {lang}"), "tests/interop/run.sh", &[lang]);
}

#[test]
#[ignore = "system test: `cargo test -- --include-ignored` runs it, as README and CI do"]
fn python_client_and_example() {
    interop("python");
}

#[test]
#[ignore = "system test: `cargo test -- --include-ignored` runs it, as README and CI do"]
fn go_client_and_example() {
    interop("go");
}

#[test]
#[ignore = "system test: `cargo test -- --include-ignored` runs it, as README and CI do"]
fn java_client_and_example() {
    interop("java");
}

#[test]
#[ignore = "system test: `cargo test -- --include-ignored` runs it, as README and CI do"]
fn node_client_and_example() {
    interop("node");
}
