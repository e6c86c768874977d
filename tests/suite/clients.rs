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
#[ignore = "system test: `cargo test -- --include-ignored` runs it, as README and CI do"]
fn python_client() {
    client_tests("python");
}

#[test]
#[ignore = "system test: `cargo test -- --include-ignored` runs it, as README and CI do"]
fn go_client() {
    client_tests("go");
}

#[test]
#[ignore = "system test: `cargo test -- --include-ignored` runs it, as README and CI do"]
fn java_client() {
    client_tests("java");
}

#[test]
#[ignore = "system test: `cargo test -- --include-ignored` runs it, as README and CI do"]
fn node_client() {
    client_tests("node");
}

/// The Rust client installs like any crate: `cargo package` (which builds the packaged crate on its own,
/// from a copy that holds only the crate's files, the contract included) succeeds — with the core, whose
/// filter a mirror runs, packaged beside it as it would be published.
#[test]
#[ignore = "system test: `cargo test -- --include-ignored` runs it, as README and CI do"]
fn the_rust_client_packages_and_its_package_builds() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let target = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(cargo)
        .args([
            "package",
            "-p",
            "existence-gate-core",
            "-p",
            "existence-gate-client",
            "--allow-dirty",
            "--offline",
        ])
        .arg("--target-dir")
        .arg(target.path())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "cargo package failed:\n{log}");
    assert!(log.contains("Verifying existence-gate-client"), "{log}");
    let crate_file = target
        .path()
        .join("package/existence-gate-client-0.1.0.crate");
    assert!(
        crate_file.exists(),
        "{} is missing:\n{log}",
        crate_file.display()
    );
}
