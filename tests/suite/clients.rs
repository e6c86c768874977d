//! Each client library's own tests (`clients/LANG/test.sh`: builds the library with its stubs generated
//! from `proto/`, then runs the tests with that ecosystem's runner, against servers they start from the
//! binary built by this `cargo test`). The Rust client's tests run as its own crate's tests.
//!
//! A language whose toolchain is missing is SKIPPED with a loud message and passes, unless
//! `EXISTENCE_GATE_REQUIRE_INTEROP=1` (as in CI), where it fails. `.ci/install-interop` installs them all.

use crate::common;

use common::polyglot::run_suite;
use existence_gate::core::hashing::FilterHasher;

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

/// The client libraries' mirrors (Go, Java) port the fast hash; `clients/testdata/filter-hash.txt`
/// holds the values theirs must give, one line per key: `seed key-hex hash`, keys of every length
/// foldhash treats differently (≤ 16 bytes, ≤ 128, longer). This test keeps the file equal to what the
/// gate computes; `EXISTENCE_GATE_BLESS=1` rewrites it (only ever for a new file: the values must never
/// change, see `hash_functions_are_stable` in
/// `crates/core/src/hashing.rs`).
#[test]
fn the_clients_hash_vectors_are_the_gates() {
    let path = common::workspace_root().join("clients/testdata/filter-hash.txt");
    let mut expected = String::from(
        "# The gate's fast keyed hash (FilterHasher: foldhash fast, hash_one of the key's bytes).\n\
         # seed (hex), key (hex, '-' for empty), hash (decimal). Checked by tests/suite/clients.rs.\n",
    );
    let lengths = (0..=40).chain([63, 64, 65, 127, 128, 129, 200, 255, 256, 257, 1000]);
    for seed in [0, 1, 0xdead_beef_cafe_babe, u64::MAX] {
        let hasher = FilterHasher::from_seed(seed);
        for length in lengths.clone() {
            let key: Vec<u8> = (0..length)
                .map(|i| (i * 31 + length) as u8 ^ seed as u8)
                .collect();
            let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
            let hex = if hex.is_empty() { "-".to_string() } else { hex };
            expected += &format!("{seed:016x} {hex} {}\n", hasher.hash(&key).0);
        }
    }
    if std::env::var_os("EXISTENCE_GATE_BLESS").is_some() {
        std::fs::write(&path, &expected).expect("writing the vectors");
    }
    let found = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        found == expected,
        "{} is not the gate's hash (EXISTENCE_GATE_BLESS=1 writes it)",
        path.display()
    );
}
