//! The tree is the architecture: the core (`crates/core`, the state machine: a crate of its own, so the
//! compiler refuses any path from it to storage, replication, the service or the wiring) uses no network
//! crate, opens no file or socket and reads no clock but the one it is given (`core/clock.rs`); storage
//! (`crates/storage`, a crate too) uses the core only; replication (`crates/replication`) the core and storage;
//! the service (`crates/service`) the core and storage but neither replication (its `Cargo.toml` has no
//! such dependency: a replica reaches it through the core's `Writes` and `Replicas` traits) nor the wiring
//! (`src/server/`). The operator commands (`src/cli/`) are clients:
//! they use the generated contract and the core's pure helpers, of the service only the spec's status names,
//! and nothing of storage or the wiring; no part of the server uses them.
//!
//! This test parses every source (`syn`), resolves every path to where it leads — grouped imports
//! expanded, `self::`/`super::` followed from the file's module, names brought in by `use` (renamed or not)
//! and `extern crate … as`, and paths inside macro calls — and names each one that crosses a layer the wrong
//! way, so an import that would blur the layers fails CI instead of waiting for a review. The second test
//! proves each of those forms is caught.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// What a layer's sources must not reach: resolved path prefixes (`crate::storage`, `tokio::net`,
/// `async_nats`), but for the allowed ones.
struct Rule {
    layer: &'static str,
    forbidden: &'static [&'static [&'static str]],
    /// `(file, path prefix)`: a path the file may use although a forbidden prefix covers it; `*` for every
    /// file of the layer.
    allowed: &'static [(&'static str, &'static str)],
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
    "pgwire_replication",
    "metrics_exporter_prometheus",
];

/// What touches the operating system beyond memory and threads: files, sockets, processes, raw system
/// calls and its clocks. The core reaches none of it (time only through `core/clock.rs`).
const OPERATING_SYSTEM: &[&str] = &[
    "std::fs",
    "std::net",
    "std::process",
    "std::env",
    "std::time::Instant",
    "std::time::SystemTime",
    "tokio::fs",
    "tokio::net",
    "tokio::process",
    "tokio::time",
    "rustix",
    "libc",
    "nix",
];

/// The replicated mode's parts that do I/O, which its pure protocol must not use.
const REPLICATION_IO: &[&str] = &[
    "crate::replication::replica",
    "crate::replication::stream",
    "crate::replication::snapshot_store",
    "crate::replication::replica_snapshots",
    "crate::replication::replicated_rebuild",
];

/// The wire crates a layer below the service does not speak.
const WIRE_CRATES: &[&str] = &["tonic", "prost", "hyper", "axum", "h2", "tower"];

const RULES: &[Rule] = &[
    Rule {
        layer: "core",
        forbidden: &[
            &[
                "crate::storage",
                "crate::replication",
                "crate::service",
                "crate::server",
                "crate::cli",
                "crate::feed",
            ],
            NETWORK_CRATES,
            OPERATING_SYSTEM,
        ],
        allowed: &[
            ("core/clock.rs", "std::time::Instant"),
            ("core/clock.rs", "std::time::SystemTime"),
            // Memory, not I/O: a large filter layer's own mapping, advised for huge pages; its test reads
            // the mapping's flags from /proc/self/smaps.
            ("core/filter/memory.rs", "rustix"),
            ("core/filter/memory.rs", "std::fs"),
            // The sub-lease simulation (a test module) reads how many seeds to run: the harness, not the
            // rules it drives.
            ("core/sublease/simulation.rs", "std::env::var"),
        ],
    },
    Rule {
        layer: "storage",
        forbidden: &[
            &[
                "crate::replication",
                "crate::service",
                "crate::server",
                "crate::cli",
                "crate::feed",
                "async_nats",
            ],
            WIRE_CRATES,
        ],
        allowed: &[],
    },
    Rule {
        // The replication protocol: pure rules over an injected clock, driven alike by the replica and by the
        // deterministic simulation; no I/O, no runtime, no other part of the replicated mode.
        layer: "replication/protocol",
        forbidden: &[
            &[
                "crate::storage",
                "crate::service",
                "crate::server",
                "crate::cli",
                "crate::feed",
                "tokio",
            ],
            REPLICATION_IO,
            NETWORK_CRATES,
            OPERATING_SYSTEM,
        ],
        // The simulation (a test module) reads how many seeds to run, and from which: the harness, not
        // the rules it drives.
        allowed: &[("replication/protocol/simulation.rs", "std::env::var")],
    },
    Rule {
        layer: "replication",
        forbidden: &[
            &[
                "crate::service",
                "crate::server",
                "crate::cli",
                "crate::feed",
            ],
            WIRE_CRATES,
        ],
        allowed: &[],
    },
    Rule {
        layer: "service",
        forbidden: &[&["crate::server", "crate::cli", "crate::feed"]],
        allowed: &[],
    },
    Rule {
        layer: "server",
        forbidden: &[&["crate::cli", "crate::feed"]],
        allowed: &[],
    },
    Rule {
        // What the commands and the feed share as clients of a gate: neither of them, nor the server side.
        layer: "client",
        forbidden: &[&[
            "crate::storage",
            "crate::replication",
            "crate::service",
            "crate::server",
            "crate::cli",
            "crate::feed",
        ]],
        allowed: &[],
    },
    Rule {
        layer: "cli",
        forbidden: &[&[
            "crate::storage",
            "crate::replication",
            "crate::service",
            "crate::server",
            "crate::feed",
        ]],
        allowed: &[],
    },
    Rule {
        // A process of its own beside the gate: a client of it (`client`) that serves its own metrics and
        // health (the service's HTTP serving), knowing nothing of storage, the server wiring or the commands.
        layer: "feed",
        forbidden: &[&["crate::storage", "crate::server", "crate::cli"]],
        allowed: &[],
    },
];

/// The layers that are crates of their own (`crates/LAYER`, `existence_gate_LAYER`).
const LAYER_CRATES: &[&str] = &["core", "storage", "replication", "service"];

/// Where a layer's sources are: the core, storage, replication and the service are crates of their own
/// (`crates/LAYER/src`, where the compiler already refuses any path to the layers above them), the others
/// are modules of `src/`.
fn layer_dir(layer: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (top, within) = layer.split_once('/').unwrap_or((layer, ""));
    if LAYER_CRATES.contains(&top) {
        root.join("crates").join(top).join("src").join(within)
    } else {
        root.join("src").join(layer)
    }
}

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

/// The module a file under `src/` defines: `core/lease.rs` is `crate::core::lease`, `core/mod.rs` is
/// `crate::core`.
fn module_of(file: &str) -> Vec<String> {
    let mut module = vec!["crate".to_string()];
    let stem = file.trim_end_matches(".rs");
    module.extend(
        stem.split('/')
            .filter(|part| *part != "mod" && *part != "lib")
            .map(str::to_string),
    );
    module
}

/// One path a source reaches, resolved, with the line it is on.
struct Reached {
    line: usize,
    path: Vec<String>,
}

/// Collects every path of a file, resolved from its module and its `use` items.
struct Paths {
    /// The module of the item being visited (inline `mod`s push onto the file's).
    module: Vec<String>,
    /// Names brought in by `use` and `extern crate`, to the paths they stand for.
    imported: HashMap<String, Vec<String>>,
    reached: Vec<Reached>,
}

impl Paths {
    /// Resolves `segments` (written with a leading `::` when `absolute`) as seen from the current module.
    fn resolve(&self, absolute: bool, segments: &[String]) -> Option<Vec<String>> {
        let (first, rest) = segments.split_first()?;
        if absolute {
            return Some(segments.to_vec());
        }
        let mut resolved = match first.as_str() {
            "crate" => return Some(self.resolve_crate_root(rest)),
            "self" => self.module.clone(),
            "super" => {
                let mut module = self.module.clone();
                module.pop();
                let mut rest = rest;
                while rest.first().is_some_and(|s| s == "super") {
                    module.pop();
                    rest = &rest[1..];
                }
                module.extend(rest.iter().cloned());
                return Some(module);
            }
            "Self" => return None,
            name => match name.strip_prefix("existence_gate_") {
                Some(layer) if LAYER_CRATES.contains(&layer) => {
                    vec!["crate".to_string(), layer.to_string()]
                }
                _ => self
                    .imported
                    .get(name)
                    .cloned()
                    .unwrap_or_else(|| vec![name.to_string()]),
            },
        };
        resolved.extend(rest.iter().cloned());
        Some(resolved)
    }

    /// `crate::rest` as the one tree the rules speak of: in a layer that is a crate of its own, `crate` is
    /// that layer (`crate::stream` in the replication crate is `crate::replication::stream`), except where
    /// `rest` names a layer — the crates beneath, which each crate's root imports under their layer's name
    /// (`use existence_gate_core as core;`), or one above, which the compiler refuses anyway.
    fn resolve_crate_root(&self, rest: &[String]) -> Vec<String> {
        let mut resolved = vec!["crate".to_string()];
        let names_a_layer = rest
            .first()
            .is_some_and(|s| RULES.iter().any(|rule| rule.layer == s.as_str()));
        match self.module.get(1) {
            Some(layer) if LAYER_CRATES.contains(&layer.as_str()) && !names_a_layer => {
                resolved.push(layer.clone())
            }
            _ => {}
        }
        resolved.extend(rest.iter().cloned());
        resolved
    }

    fn reach(&mut self, line: usize, absolute: bool, segments: &[String]) {
        if let Some(path) = self.resolve(absolute, segments) {
            self.reached.push(Reached { line, path });
        }
    }

    /// Every path a `use` tree names, expanded (`a::{b, c::d}` is `a::b` and `a::c::d`), recording the
    /// names it brings into scope.
    fn use_tree(&mut self, absolute: bool, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(absolute, prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Name(name) => {
                self.import(absolute, prefix, &name.ident, &name.ident);
            }
            syn::UseTree::Rename(rename) => {
                self.import(absolute, prefix, &rename.ident, &rename.rename);
            }
            syn::UseTree::Glob(glob) => {
                let line = glob.star_token.span.start().line;
                self.reach(line, absolute, prefix);
            }
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(absolute, prefix, tree);
                }
            }
        }
    }

    fn import(
        &mut self,
        absolute: bool,
        prefix: &[String],
        ident: &syn::Ident,
        alias: &syn::Ident,
    ) {
        let mut segments = prefix.to_vec();
        if ident != "self" {
            segments.push(ident.to_string());
        }
        let Some(path) = self.resolve(absolute, &segments) else {
            return;
        };
        if alias != "_" {
            let name = if alias == "self" {
                segments.last().cloned().unwrap_or_default()
            } else {
                alias.to_string()
            };
            self.imported.insert(name, path.clone());
        }
        let line = ident.span().start().line;
        self.reached.push(Reached { line, path });
    }

    /// Paths written inside a macro call's tokens (`format!("{}", tokio::net::X)`): runs of
    /// `ident :: ident …`, with a leading `::` kept.
    fn macro_tokens(&mut self, tokens: TokenStream) {
        let mut run: Vec<String> = Vec::new();
        let mut absolute = false;
        let mut colons = 0;
        let mut line = 0;
        let flush = |this: &mut Self, run: &mut Vec<String>, absolute: &mut bool, line: usize| {
            if run.len() > 1 || *absolute {
                this.reach(line, *absolute, run);
            }
            run.clear();
            *absolute = false;
        };
        for token in tokens {
            match token {
                TokenTree::Ident(ident) if run.is_empty() || colons == 2 => {
                    if run.is_empty() {
                        line = ident.span().start().line;
                    }
                    run.push(ident.to_string());
                    colons = 0;
                }
                TokenTree::Punct(punct) if punct.as_char() == ':' && colons < 2 => {
                    colons += 1;
                    if run.is_empty() && colons == 2 {
                        absolute = true;
                    }
                }
                other => {
                    flush(self, &mut run, &mut absolute, line);
                    colons = 0;
                    match other {
                        TokenTree::Group(group) => self.macro_tokens(group.stream()),
                        TokenTree::Ident(ident) => {
                            line = ident.span().start().line;
                            run.push(ident.to_string());
                        }
                        _ => {}
                    }
                }
            }
        }
        flush(self, &mut run, &mut absolute, line);
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(item.leading_colon.is_some(), &mut Vec::new(), &item.tree);
    }

    fn visit_item_extern_crate(&mut self, item: &'ast syn::ItemExternCrate) {
        let name = item.ident.to_string();
        let alias = item.rename.as_ref().map_or(&item.ident, |(_, alias)| alias);
        self.imported.insert(alias.to_string(), vec![name.clone()]);
        let line = item.ident.span().start().line;
        self.reached.push(Reached {
            line,
            path: vec![name],
        });
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        self.module.push(item.ident.to_string());
        syn::visit::visit_item_mod(self, item);
        self.module.pop();
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if let Some(first) = path.segments.first() {
            let line = first.ident.span().start().line;
            self.reach(line, path.leading_colon.is_some(), &segments);
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.macro_tokens(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }
}

/// Every path `text` (the file `file`, relative to `src/`) reaches. The `use` items are read first, so a
/// name imported below its first use still resolves.
fn reached(file: &str, text: &str) -> Vec<Reached> {
    let syntax = syn::parse_file(text).unwrap_or_else(|e| panic!("{file}: does not parse: {e}"));
    let mut paths = Paths {
        module: module_of(file),
        imported: HashMap::new(),
        reached: Vec::new(),
    };
    for item in &syntax.items {
        if let syn::Item::Use(item) = item {
            paths.visit_item_use(item);
        }
    }
    paths.reached.clear();
    paths.visit_file(&syntax);
    paths.reached
}

/// Whether `path` is `prefix` or lies under it.
fn under(path: &[String], prefix: &str) -> bool {
    let prefix: Vec<&str> = prefix.split("::").collect();
    path.len() >= prefix.len() && path.iter().zip(&prefix).all(|(a, b)| a == b)
}

/// The paths of `text` (from `file`, relative to `src/`) that break `rule`, as `file:line: path`.
fn violations(rule: &Rule, file: &str, text: &str) -> Vec<String> {
    let mut found: Vec<String> = reached(file, text)
        .into_iter()
        .filter(|reached| {
            let forbidden = rule
                .forbidden
                .iter()
                .flat_map(|list| list.iter())
                .any(|prefix| under(&reached.path, prefix));
            let allowed = rule.allowed.iter().any(|(allowed_file, prefix)| {
                (*allowed_file == "*" || *allowed_file == file) && under(&reached.path, prefix)
            });
            forbidden && !allowed
        })
        .map(|reached| format!("{file}:{}: {}", reached.line, reached.path.join("::")))
        .collect();
    found.dedup();
    found
}

#[test]
fn each_layer_uses_only_the_layers_beneath_it() {
    let mut found = Vec::new();
    for rule in RULES {
        let dir = layer_dir(rule.layer);
        let files = sources(&dir);
        assert!(!files.is_empty(), "{} has no sources", dir.display());
        for file in files {
            let text = std::fs::read_to_string(&file).expect("a readable source");
            let within = file.strip_prefix(&dir).unwrap_or(&file).display();
            let shown = format!("{}/{within}", rule.layer);
            found.extend(violations(rule, &shown, &text));
        }
    }
    assert!(
        found.is_empty(),
        "paths that cross a layer the wrong way (core < storage < replication < service < server; cli \
         beside them; the core touches no file, socket or clock):\n{}",
        found.join("\n")
    );
}

fn rule(layer: &str) -> &'static Rule {
    RULES
        .iter()
        .find(|r| r.layer == layer)
        .expect("a rule for the layer")
}

/// The scanner itself: it must catch each form of crossing (or the test above proves nothing) and must not
/// flag names that merely contain a forbidden one.
#[test]
fn the_scanner_catches_every_form_of_crossing_and_only_those() {
    let core = rule("core");
    let file = "core/namespace.rs";
    let caught = [
        ("use crate::storage::wal;", "crate::storage::wal"),
        (
            "use crate::{core::log::Log, storage::wal::Wal};",
            "crate::storage::wal::Wal",
        ),
        (
            "fn f() { super::super::storage::wal::open(); }",
            "crate::storage::wal::open",
        ),
        (
            "mod inner { fn f() { super::super::super::server::start(); } }",
            "crate::server::start",
        ),
        ("use super::super::feed;", "crate::feed"),
        ("fn f() { crate::server::start() }", "crate::server::start"),
        ("fn f() -> tonic::Status { todo!() }", "tonic::Status"),
        ("use ::async_nats as n;", "async_nats"),
        (
            "extern crate async_nats as n; fn f() { n::connect(); }",
            "async_nats::connect",
        ),
        (
            "use tokio_postgres as pg; fn f(_: pg::Client) {}",
            "tokio_postgres::Client",
        ),
        ("use std::fs;", "std::fs"),
        ("fn f() { let _ = std::fs::read(\"x\"); }", "std::fs::read"),
        ("use std::{fs::File, io};", "std::fs::File"),
        ("use tokio::{fs, net::TcpStream};", "tokio::fs"),
        ("use tokio::{fs, net::TcpStream};", "tokio::net::TcpStream"),
        (
            "fn f() { tokio::net::TcpListener::bind(\"\"); }",
            "tokio::net::TcpListener::bind",
        ),
        ("use rustix::fs::fsync;", "rustix::fs::fsync"),
        ("fn f() { unsafe { libc::getpid() }; }", "libc::getpid"),
        (
            "use pgwire_replication::Client;",
            "pgwire_replication::Client",
        ),
        (
            "use std::time::Instant; fn f() { let _ = Instant::now(); }",
            "std::time::Instant::now",
        ),
        (
            "use std::time::{Duration, SystemTime};",
            "std::time::SystemTime",
        ),
        (
            "fn f() { println!(\"{:?}\", std::time::Instant::now()); }",
            "std::time::Instant::now",
        ),
        (
            "fn f() { let _ = format!(\"{}\", ::libc::EINTR); }",
            "libc::EINTR",
        ),
    ];
    for (source, path) in caught {
        let found = violations(core, file, source);
        assert!(
            found.iter().any(|f| f.ends_with(&format!(": {path}"))),
            "{source:?} should be caught as {path}; found {found:?}"
        );
    }
    assert_eq!(
        violations(core, file, "use crate::storage::wal;"),
        ["core/namespace.rs:1: crate::storage::wal"]
    );

    let innocent = "use crate::core::log::Log;\nuse super::hashing::KeyHash;\nfn f() { let http_port = 1; \
                    my_tonic::x(); let _ = std::time::Duration::ZERO; }\nuse std::io::Error as hyper_error;\n\
                    fn g() -> hyper_error { todo!() }";
    assert_eq!(violations(core, file, innocent), Vec::<String>::new());
    assert_eq!(
        violations(
            core,
            "core/clock.rs",
            "use std::time::{Instant, SystemTime};"
        ),
        Vec::<String>::new(),
        "the core's clock is where the clocks are read"
    );

    let client = rule("client");
    let source = "use crate::proto::code_name;\nuse crate::service::auth::hash_token;";
    assert_eq!(
        violations(client, "client/z.rs", source),
        ["client/z.rs:2: crate::service::auth::hash_token"]
    );
    let protocol = rule("replication/protocol");
    assert_eq!(
        violations(
            protocol,
            "replication/protocol/rules.rs",
            "use super::super::stream::Reports;"
        ),
        ["replication/protocol/rules.rs:1: crate::replication::stream::Reports"]
    );
    // In a layer that is a crate of its own, `crate::` is that layer, and the crates beneath are named by
    // their layer (through the root's `use existence_gate_storage as storage;` or the crate's own name).
    assert_eq!(
        violations(
            protocol,
            "replication/protocol/rules.rs",
            "use crate::stream::Reports;\nfn f() { crate::storage::sync_dir(); existence_gate_storage::wal::open(); }"
        ),
        [
            "replication/protocol/rules.rs:1: crate::replication::stream::Reports",
            "replication/protocol/rules.rs:2: crate::storage::sync_dir",
            "replication/protocol/rules.rs:2: crate::storage::wal::open",
        ]
    );
}
