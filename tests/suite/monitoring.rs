//! The shipped monitoring: the Prometheus rules (`deploy/prometheus/`) and the Grafana dashboard
//! (`deploy/grafana/`). Every series they name is one the gate exports — a name in a metric's registration
//! in the sources, so renaming a metric fails here, not in production — and the dashboard's single-server
//! series are on a running gate's `/metrics` after a few calls. Where `promtool` is installed (Debian's
//! `prometheus` package; required in CI through `EXISTENCE_GATE_REQUIRE_PROMTOOL`), the rules pass
//! `promtool check rules` and their unit tests (`promtool test rules`: each alert fires on the series that
//! should raise it, and not on others).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::PATIENCE;
use existence_gate::proto::{AddRequest, MayExistRequest, RecordAbsentRequest};

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

/// The gate's series that `text` names (`existence_...`, a histogram's `_bucket`/`_sum`/`_count` taken
/// back to its name), sorted, once each.
fn series_named(text: &str) -> Vec<String> {
    let mut named: Vec<String> = text
        .match_indices("existence_")
        .map(|(at, _)| {
            let rest = &text[at..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let name = &rest[..end];
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(name)
                .to_string()
        })
        .filter(|name| !name.starts_with("existence_gate"))
        .collect();
    named.sort_unstable();
    named.dedup();
    named
}

/// Those of `named` that no source registers.
fn unregistered(named: &[String]) -> Vec<String> {
    let root = crate::common::workspace_root();
    let mut files = Vec::new();
    for dir in ["crates", "src"] {
        sources(&root.join(dir), &mut files);
    }
    let code: String = files
        .iter()
        .map(|file| std::fs::read_to_string(file).unwrap())
        .collect();
    named
        .iter()
        .filter(|name| !code.contains(&format!("\"{name}\"")))
        .cloned()
        .collect()
}

#[test]
fn every_series_the_rules_name_is_one_the_gate_exports() {
    let rules = std::fs::read_to_string(rules_dir().join("existence-gate.rules.yml")).unwrap();
    let named = series_named(&rules);
    assert!(named.len() >= 8, "{named:?}");
    let missing = unregistered(&named);
    assert!(
        missing.is_empty(),
        "deploy/prometheus/existence-gate.rules.yml names series no source registers: {missing:?}"
    );
}

/// Every `expr` of a Grafana dashboard's panels, however deep.
fn queries(value: &serde_json::Value, found: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(fields) => {
            for (key, value) in fields {
                match (key.as_str(), value) {
                    ("expr", serde_json::Value::String(expr)) => found.push(expr.clone()),
                    _ => queries(value, found),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|item| queries(item, found)),
        _ => {}
    }
}

/// Series a single server exports only once something happens (a connection refused, a wall-clock step,
/// a call shed): registered, but not on `/metrics` after ordinary calls.
const ON_EVENTS: &[&str] = &[
    "existence_resp_connections_refused_total",
    "existence_resp_budget_closes_total",
    "existence_resp_deadline_closes_total",
    "existence_clock_steps_total",
];

#[tokio::test]
async fn every_series_the_dashboard_queries_is_one_the_gate_exports() {
    let path = crate::common::workspace_root().join("deploy/grafana/existence-gate.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut found = Vec::new();
    queries(&dashboard, &mut found);
    assert!(found.len() >= 20, "{} queries", found.len());
    let named = series_named(&found.join("\n"));
    let missing = unregistered(&named);
    assert!(
        missing.is_empty(),
        "deploy/grafana/existence-gate.json queries series no source registers: {missing:?}"
    );
    // The binary as deployed (durable, on its steady clock), after a few calls, exports every series of a
    // single server's the dashboard shows.
    let dir = tempfile::tempdir().unwrap();
    let config = crate::common::replicas::config_file(
        dir.path(),
        "[namespaces.users]\nexpected_keys = 1000\n",
    );
    let mut command = crate::common::binary::serve();
    command
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path().join("data"));
    let served = crate::common::binary::start(command).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", served.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client =
        existence_gate::proto::existence_gate_client::ExistenceGateClient::new(channel);
    client
        .add(AddRequest {
            namespace: "users".into(),
            keys: vec!["k".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    client
        .may_exist(MayExistRequest {
            namespace: "users".into(),
            key: "other".into(),
        })
        .await
        .unwrap();
    client
        .record_absent(RecordAbsentRequest {
            namespace: "users".into(),
            key: "other".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let resp_addr = served.resp_addr.clone().expect("the RESP port is on");
    let mut resp = redis::Client::open(format!("redis://{resp_addr}/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: i64 = redis::cmd("BF.EXISTS")
        .arg(&["users", "k"])
        .query_async(&mut resp)
        .await
        .unwrap();
    let own: Vec<&String> = named
        .iter()
        .filter(|name| {
            !name.starts_with("existence_replica_")
                && !name.starts_with("existence_feed_")
                && !ON_EVENTS.contains(&name.as_str())
        })
        .collect();
    let http_addr = served.http_addr.parse().unwrap();
    // Gauges the background ticks publish (writes refused, the clock) appear within a tick.
    let absent = async || -> Vec<String> {
        let metrics = match crate::common::try_http_get(http_addr, "/metrics").await {
            Ok((_, metrics)) => metrics,
            Err(_) => String::new(),
        };
        own.iter()
            .filter(|name| !metrics.lines().any(|line| line.starts_with(name.as_str())))
            .map(|name| name.to_string())
            .collect()
    };
    let all_there = tokio::time::timeout(PATIENCE, async {
        while !absent().await.is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
    if all_there.is_err() {
        panic!(
            "the dashboard queries series the running binary does not export: {:?}",
            absent().await
        );
    }
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
