//! The shipped Prometheus rules (`deploy/prometheus/`): every series they name is one the gate exports (a
//! name in a metric's registration in the sources — renaming a metric fails here, not in production), and,
//! where `promtool` is installed (Debian's `prometheus` package; required in CI through
//! `EXISTENCE_GATE_REQUIRE_PROMTOOL`), they pass `promtool check rules` and their unit tests
//! (`promtool test rules`: each alert fires on the series that should raise it, and not on others).

use std::path::{Path, PathBuf};
use std::process::Command;

fn rules_dir() -> PathBuf {
    crate::common::workspace_root().join("deploy/prometheus")
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn every_series_the_rules_name_is_one_the_gate_exports() {
    let rules = std::fs::read_to_string(rules_dir().join("existence-gate.rules.yml")).unwrap();
    let mut named: Vec<&str> = rules
        .match_indices("existence_")
        .map(|(at, _)| {
            let rest = &rules[at..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .filter(|name| !name.starts_with("existence_gate"))
        .collect();
    named.sort_unstable();
    named.dedup();
    assert!(named.len() >= 8, "{named:?}");
    let root = crate::common::workspace_root();
    let mut files = Vec::new();
    for dir in ["crates", "src"] {
        sources(&root.join(dir), &mut files);
    }
    let code: String = files
        .iter()
        .map(|file| std::fs::read_to_string(file).unwrap())
        .collect();
    let missing: Vec<&&str> = named
        .iter()
        .filter(|name| !code.contains(&format!("\"{name}\"")))
        .collect();
    assert!(
        missing.is_empty(),
        "deploy/prometheus/existence-gate.rules.yml names series no source registers: {missing:?}"
    );
}

#[test]
fn the_rules_pass_promtool_and_their_unit_tests() {
    if Command::new("promtool").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("EXISTENCE_GATE_REQUIRE_PROMTOOL").is_none(),
            "promtool is required (EXISTENCE_GATE_REQUIRE_PROMTOOL) but not installed: apt-get install prometheus"
        );
        eprintln!("note: promtool is not installed (apt-get install prometheus); the rules' checks are skipped");
        return;
    }
    for args in [
        ["check", "rules", "existence-gate.rules.yml"],
        ["test", "rules", "existence-gate.tests.yml"],
    ] {
        let output = Command::new("promtool")
            .args(args)
            .current_dir(rules_dir())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
