//! Each client library's own tests (`clients/LANG/test.sh`: builds the library with its stubs generated
//! from `proto/`, then runs the tests with that ecosystem's runner, against servers they start from the
//! binary built by this `cargo test`). The Rust client's tests run as its own crate's tests.
//!
//! A language whose toolchain is missing is SKIPPED with a loud message and passes, unless
//! `EXISTENCE_GATE_REQUIRE_INTEROP=1` (as in CI), where it fails. `.ci/install-interop` installs them all.

use crate::common;

use common::polyglot::run_suite;

fn client_tests(lang: &str) {
    run_suite(
        &format!("{lang} client"),
        &format!("clients/{lang}/test.sh"),
        &[],
    );
}

#[test]
fn python_client() {
    client_tests("python");
}

#[test]
fn go_client() {
    client_tests("go");
}

#[test]
fn java_client() {
    client_tests("java");
}

#[test]
fn node_client() {
    client_tests("node");
}
