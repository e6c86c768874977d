//! The tree is the architecture: `src/core/` (the state machine) uses neither storage, the service, the wiring
//! nor any network crate; `src/storage/` uses the core only; `src/service/` uses the core and storage but not the
//! wiring (`src/server/`). The operator commands (`src/cli/`) are clients: they use the generated contract and
//! the core's pure helpers, of the service only the spec's status names, and nothing of storage or the wiring;
//! no part of the server uses them. This test reads the sources and names every line that crosses a layer the
//! wrong way, so an import that would blur the layers fails CI instead of waiting for a review.

use std::path::{Path, PathBuf};

/// What a layer's sources must not mention: paths into other parts of the crate (but for the `allowed` paths
/// inside them), and external crates.
struct Rule {
    layer: &'static str,
    forbidden_modules: &'static [&'static str],
    allowed: &'static [&'static str],
    forbidden_crates: &'static [&'static str],
    /// More names the layer must not use as a path's first segment.
    forbidden_more: &'static [&'static str],
}

/// Crates that speak a network protocol or a storage engine: the core stays free of all of them.
const NETWORK_CRATES: &[&str] = &[
    "tonic",
    "tonic_health",
    "tonic_reflection",
    "prost",
    "hyper",
    "hyper_util",
    "h2",
    "axum",
    "tower",
    "http",
    "tokio_rustls",
    "rustls",
    "async_nats",
    "tokio_postgres",
    "metrics_exporter_prometheus",
];

/// The protocol is a pure state machine: besides the network crates, no runtime, no clock of its own.
const RUNTIME_AND_CLOCKS: &[&str] = &["tokio", "Instant", "SystemTime"];

const RULES: &[Rule] = &[
    Rule {
        layer: "core",
        forbidden_modules: &["storage", "service", "server", "cli", "feed"],
        allowed: &[],
        forbidden_crates: NETWORK_CRATES,
        forbidden_more: &[],
    },
    Rule {
        layer: "storage",
        forbidden_modules: &["replication", "service", "server", "cli", "feed"],
        allowed: &[],
        forbidden_crates: &[
            "tonic",
            "prost",
            "hyper",
            "axum",
            "h2",
            "tower",
            "async_nats",
        ],
        forbidden_more: &[],
    },
    Rule {
        // The replication protocol: pure rules over an injected clock, driven alike by the replica and by the
        // deterministic simulation; no I/O, no runtime, no other part of the replicated mode.
        layer: "replication/protocol",
        forbidden_modules: &[
            "storage",
            "service",
            "server",
            "cli",
            "feed",
            "replication::replica",
            "replication::stream",
            "replication::snapshot_store",
            "replication::replica_snapshots",
            "replication::replicated_rebuild",
        ],
        allowed: &[],
        forbidden_crates: NETWORK_CRATES,
        forbidden_more: RUNTIME_AND_CLOCKS,
    },
    Rule {
        layer: "replication",
        forbidden_modules: &["service", "server", "cli", "feed"],
        allowed: &[],
        forbidden_crates: &["tonic", "prost", "hyper", "axum", "h2", "tower"],
        forbidden_more: &[],
    },
    Rule {
        layer: "service",
        forbidden_modules: &["server", "cli", "feed"],
        allowed: &[],
        forbidden_crates: &[],
        forbidden_more: &[],
    },
    Rule {
        layer: "server",
        forbidden_modules: &["cli", "feed"],
        allowed: &[],
        forbidden_crates: &[],
        forbidden_more: &[],
    },
    Rule {
        layer: "cli",
        forbidden_modules: &["storage", "service", "server", "feed"],
        // The gRPC status names the metrics use too: one table of the spec's names.
        allowed: &["crate::service::metrics::code_name"],
        forbidden_crates: &[],
        forbidden_more: &[],
    },
    Rule {
        // A process of its own beside the gate: a client of it (cli's connection) that serves its own
        // metrics and health (the service's HTTP serving), knowing nothing of storage or the server wiring.
        layer: "feed",
        forbidden_modules: &["storage", "server"],
        allowed: &[],
        forbidden_crates: &[],
        forbidden_more: &[],
    },
];

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            found.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
    found
}

/// Whether `line` names `name` as the first segment of a path (`name::…`) or in a `use name` / `extern crate`.
fn names_crate(line: &str, name: &str) -> bool {
    let bytes = line.as_bytes();
    line.match_indices(name).any(|(at, _)| {
        let before_ok = at == 0 || {
            let c = bytes[at - 1];
            !(c.is_ascii_alphanumeric() || c == b'_' || c == b':')
        };
        let rest = &line[at + name.len()..];
        let after_ok = rest.starts_with("::")
            || (line[..at].trim_end().ends_with("use") && rest.starts_with([';', ' ']));
        before_ok && after_ok
    })
}

/// The lines of `text` (from `file`) that break `rule`, as `file:line: text`.
fn violations(rule: &Rule, file: &str, text: &str) -> Vec<String> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| {
            let checked = rule
                .allowed
                .iter()
                .fold(line.to_string(), |line, path| line.replace(path, ""));
            rule.forbidden_modules
                .iter()
                .any(|module| checked.contains(&format!("crate::{module}")))
                || rule
                    .forbidden_crates
                    .iter()
                    .chain(rule.forbidden_more)
                    .any(|name| names_crate(line, name))
        })
        .map(|(index, line)| format!("{file}:{}: {}", index + 1, line.trim()))
        .collect()
}

#[test]
fn each_layer_uses_only_the_layers_beneath_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for rule in RULES {
        let files = sources(&src.join(rule.layer));
        assert!(!files.is_empty(), "src/{} has no sources", rule.layer);
        for file in files {
            let text = std::fs::read_to_string(&file).expect("a readable source");
            let shown = file
                .strip_prefix(&src)
                .unwrap_or(&file)
                .display()
                .to_string();
            found.extend(violations(rule, &shown, &text));
        }
    }
    assert!(
        found.is_empty(),
        "imports that cross a layer the wrong way (core < storage < replication < service < server; cli beside them):\n{}",
        found.join("\n")
    );
}

/// The scanner itself: it must catch each kind of crossing (or the test above proves nothing) and must not
/// flag names that merely contain a forbidden one.
#[test]
fn the_scanner_catches_crossings_and_only_those() {
    let core = &RULES[0];
    let crossing = "use crate::storage::wal;\nlet s = tonic::Status::ok(\"\");\nuse prost;\nfn f() { crate::server::start() }";
    let found = violations(core, "x.rs", crossing);
    assert_eq!(found.len(), 4, "{found:?}");
    assert_eq!(found[0], "x.rs:1: use crate::storage::wal;");
    let innocent = "use crate::core::log::Log;\nlet http_port = 1;\nmy_tonic::x();\nuse std::io::Error as hyper_error;";
    assert_eq!(violations(core, "y.rs", innocent), Vec::<String>::new());
    let cli = RULES.iter().find(|r| r.layer == "cli").expect("a cli rule");
    let client = "use crate::service::metrics::code_name;\nuse crate::service::auth::hash_token;";
    assert_eq!(
        violations(cli, "z.rs", client),
        ["z.rs:2: use crate::service::auth::hash_token;"]
    );
}
