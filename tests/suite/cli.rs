//! The operator commands as an operator runs them: the real binary against a real server on loopback ports
//! (and a real PostgreSQL for the bootstrap), checked by what they print, how they exit, and what the gate
//! answers afterwards.

use crate::common;

use std::process::{ExitStatus, Stdio};

use bytes::Bytes;
use common::postgres::Postgres;
use common::*;
use existence_gate::proto::{AddRequest, Answer, BatchMayExistRequest, RecordAbsentRequest};
use existence_gate::server::RunningServer;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// What a finished command left.
#[derive(Debug)]
struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Asserts a clean exit and returns the output.
    fn ok(self) -> Self {
        assert!(self.status.success(), "the command failed: {self:?}");
        self
    }

    /// Asserts a failure with exactly one line on stderr, and returns that line.
    fn failure(self) -> String {
        assert!(!self.status.success(), "the command succeeded: {self:?}");
        assert_eq!(self.stderr.lines().count(), 1, "not one line: {self:?}");
        self.stderr.trim_end().to_string()
    }
}

/// The binary with `args`, `--addr` pointing at `server`'s gRPC port, and no token or address inherited from
/// the environment.
fn command(addr: &str, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_existence-gate"));
    command
        .args(args)
        .args(["--addr", addr])
        .env_remove("EXISTENCE_GATE_TOKEN")
        .env_remove("EXISTENCE_GATE_ADDR")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// Runs the binary with `args` against `addr`, feeding it `stdin`, to completion.
async fn run_at(addr: &str, args: &[&str], stdin: &[u8]) -> Run {
    let mut child = command(addr, args)
        .stdin(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let mut input = child.stdin.take().expect("a stdin pipe");
    let stdin = stdin.to_vec();
    // Fed beside the wait: a large input must not block on a full pipe while the command writes output.
    let feeding = tokio::spawn(async move {
        // A command that exits before reading everything closes the pipe; its exit status tells why.
        let _ = input.write_all(&stdin).await;
    });
    let output = child.wait_with_output().await.expect("the binary runs");
    feeding.await.expect("stdin was fed");
    Run {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn addr(server: &RunningServer) -> String {
    format!("http://{}", server.grpc_addr)
}

async fn run(server: &RunningServer, args: &[&str]) -> Run {
    run_at(&addr(server), args, b"").await
}

async fn run_with_stdin(server: &RunningServer, args: &[&str], stdin: &[u8]) -> Run {
    run_at(&addr(server), args, stdin).await
}

/// The gate's answers for `keys` in `namespace`.
async fn answers(server: &RunningServer, namespace: &str, keys: Vec<Bytes>) -> Vec<Answer> {
    let mut client = client(server).await;
    let mut all = Vec::new();
    for chunk in keys.chunks(10_000) {
        let reply = client
            .batch_may_exist(BatchMayExistRequest {
                namespace: namespace.into(),
                keys: chunk.to_vec(),
                ..Default::default()
            })
            .await
            .expect("BatchMayExist")
            .into_inner();
        all.extend(reply.answers());
    }
    all
}

/// Asserts that every key of `keys` may exist in `namespace`, and that a key never added is absent.
async fn assert_loaded(server: &RunningServer, namespace: &str, keys: Vec<Bytes>) {
    let count = keys.len();
    let got = answers(server, namespace, keys).await;
    assert_eq!(got.len(), count);
    let absent = got.iter().filter(|a| **a != Answer::MayExist).count();
    assert_eq!(
        absent, 0,
        "{absent} of {count} loaded keys are not MAY_EXIST"
    );
    let never = format!("never-added-{}", rand::random::<u64>());
    assert_eq!(
        answers(server, namespace, vec![Bytes::from(never)]).await,
        [Answer::Absent]
    );
}

fn keys(prefix: &str, count: usize) -> Vec<Bytes> {
    (0..count)
        .map(|i| Bytes::from(format!("{prefix}-{i}")))
        .collect()
}

fn lines(keys: &[Bytes]) -> Vec<u8> {
    let mut text = Vec::new();
    for key in keys {
        text.extend_from_slice(key);
        text.push(b'\n');
    }
    text
}

const CONFIG: &str =
    "[namespaces.default]\nexpected_keys = 100000\n[namespaces.users]\nexpected_keys = 100000";

/// Started without its input (standard input closed, or /dev/null), `load`, `rebuild` and `check` say so
/// and fail, instead of reporting 0 keys as a success.
#[tokio::test]
async fn a_command_started_without_its_input_says_so() {
    let server = start(CONFIG).await;
    for args in [
        &["load", "-n", "users"][..],
        &["rebuild", "-n", "users", "-"],
        &["check"],
    ] {
        let output = command(&addr(&server), args)
            .stdin(Stdio::null())
            .output()
            .await
            .expect("the binary runs");
        let run = Run {
            status: output.status,
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        };
        let line = run.failure();
        assert!(
            line.contains("standard input is closed"),
            "{args:?}: {line}"
        );
    }
}

#[tokio::test]
async fn load_reads_a_file_and_standard_input_and_prints_one_summary_line() {
    let server = start(CONFIG).await;
    let dir = tempfile::tempdir().unwrap();
    let from_file = keys("file", 5_000);
    let path = dir.path().join("keys.txt");
    std::fs::write(&path, lines(&from_file)).unwrap();
    let loaded = run(
        &server,
        &["load", "--namespace", "users", path.to_str().unwrap()],
    )
    .await
    .ok();
    assert_eq!(loaded.stdout, "");
    // stderr is a pipe, not a terminal: no progress bar, only the summary.
    assert_eq!(loaded.stderr.lines().count(), 1, "{loaded:?}");
    assert!(
        loaded.stderr.starts_with("loaded 5,000 keys in ")
            && loaded.stderr.contains(" keys/s) into namespace \"users\""),
        "{loaded:?}"
    );
    assert_loaded(&server, "users", from_file).await;

    // Standard input, with blank lines and CRLF endings, in small batches several at a time.
    let from_stdin = keys("stdin", 3_000);
    let mut input = b"\n\r\n".to_vec();
    for key in &from_stdin {
        input.extend_from_slice(key);
        input.extend_from_slice(b"\r\n");
    }
    let loaded = run_with_stdin(
        &server,
        &[
            "load",
            "-n",
            "users",
            "--batch",
            "700",
            "--in-flight",
            "3",
            "-",
            "--json",
        ],
        &input,
    )
    .await
    .ok();
    let summary: serde_json::Value = serde_json::from_str(&loaded.stdout).expect("a JSON summary");
    assert_eq!(summary["keys"], 3_000, "{summary}");
    assert_eq!(summary["skipped"], 2, "{summary}");
    assert_eq!(summary["namespace"], "users", "{summary}");
    assert_eq!(loaded.stderr, "");
    assert_loaded(&server, "users", from_stdin).await;
}

#[tokio::test]
async fn raw_and_hex_inputs_carry_any_bytes() {
    let server = start(CONFIG).await;
    let binary: Vec<Bytes> = vec![
        Bytes::from_static(&[0xff, 0x00, 0x0a]),
        Bytes::from_static(b"with\nnewline"),
        Bytes::from(vec![7u8; 1_000]),
    ];
    let mut raw = Vec::new();
    for key in &binary {
        raw.extend_from_slice(&(key.len() as u32).to_be_bytes());
        raw.extend_from_slice(key);
    }
    run_with_stdin(&server, &["load", "--format", "raw"], &raw)
        .await
        .ok();
    assert_loaded(&server, "", binary).await;

    let hexed: Vec<Bytes> = vec![
        Bytes::from_static(&[0xde, 0xad]),
        Bytes::from_static(b"\t\r"),
    ];
    let input = "dead\n  090d  \n";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.hex");
    std::fs::write(&path, input).unwrap();
    run(
        &server,
        &[
            "load",
            "-n",
            "users",
            "--format",
            "hex",
            path.to_str().unwrap(),
        ],
    )
    .await
    .ok();
    assert_loaded(&server, "users", hexed).await;

    // Input that is not what --format says fails with a line that says where, and what the format is.
    let truncated = run_with_stdin(&server, &["load", "--format", "raw"], b"\0\0\0\x09abc")
        .await
        .failure();
    assert_eq!(
        truncated,
        "existence-gate: standard input ends inside raw key #1: it claims 9 bytes, 3 are left"
    );
    let not_hex = run_with_stdin(&server, &["load", "--format", "hex"], b"00\nxyz\n")
        .await
        .failure();
    assert!(
        not_hex.starts_with("existence-gate: line 2 of standard input is not hexadecimal"),
        "{not_hex}"
    );
}

#[tokio::test]
async fn a_key_the_gate_refuses_is_named_by_its_place_in_the_input() {
    let server = start("[limits]\nmax_key_bytes = 8\nmax_batch_keys = 100").await;
    let mut input = lines(&keys("k", 150));
    input.extend_from_slice(b"much-too-long-key\n");
    let refused = run_with_stdin(&server, &["load", "--batch", "100"], &input)
        .await
        .failure();
    assert!(
        refused.starts_with(
            "existence-gate: Add (keys[50] is key #151 of the input) failed: INVALID_ARGUMENT: keys[50] is 17 \
             bytes; the limit is max_key_bytes = 8"
        ),
        "{refused}"
    );
    // A --batch over the gate's max_batch_keys: the gate's limit, and the flag to change.
    let refused = run_with_stdin(
        &server,
        &["load", "--batch", "150"],
        &lines(&keys("k", 150)),
    )
    .await
    .failure();
    assert!(
        refused.contains(
            "INVALID_ARGUMENT: the request has 150 keys; the limit is max_batch_keys = 100"
        ) && refused.ends_with("lower --batch to the gate's max_batch_keys"),
        "{refused}"
    );
}

#[tokio::test]
async fn rebuild_replaces_the_filter_with_the_input() {
    let server = start(CONFIG).await;
    let mut gate = client(&server).await;
    let old = keys("old", 2_000);
    gate.add(AddRequest {
        namespace: "users".into(),
        keys: old.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let new = keys("new", 2_500);
    let rebuilt = run_with_stdin(
        &server,
        &["rebuild", "--namespace", "users", "--batch", "300"],
        &lines(&new),
    )
    .await
    .ok();
    assert!(
        rebuilt
            .stderr
            .starts_with("rebuilt namespace \"users\" from 2,500 keys in ")
            && rebuilt.stderr.contains("swapped in at seq "),
        "{rebuilt:?}"
    );
    assert_loaded(&server, "users", new.clone()).await;
    let old_answers = answers(&server, "users", old).await;
    let still = old_answers
        .iter()
        .filter(|a| **a == Answer::MayExist)
        .count();
    assert!(
        still < 100,
        "{still} of 2,000 keys left out of the rebuild still may exist"
    );

    let json = run_with_stdin(&server, &["rebuild", "-n", "users", "--json"], &lines(&new))
        .await
        .ok();
    let summary: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(summary["keys_rebuilt"], 2_500, "{summary}");
    assert!(summary["filter_bytes"].as_u64().unwrap() > 0, "{summary}");

    // An empty input would empty the filter: refused before anything is sent.
    let refused = run_with_stdin(&server, &["rebuild", "-n", "users"], b"\n\n")
        .await
        .failure();
    assert!(
        refused.contains("the input holds no keys: rebuilding namespace \"users\" from it would empty its filter"),
        "{refused}"
    );
    assert_loaded(&server, "users", new.clone()).await;

    // An input that breaks off midway fails the command and leaves the live filter as it was.
    let mut broken = Vec::new();
    for key in keys("partial", 1_000) {
        broken.extend_from_slice(hex::encode(&key).as_bytes());
        broken.push(b'\n');
    }
    broken.extend_from_slice(b"zz\n");
    let refused = run_with_stdin(
        &server,
        &["rebuild", "-n", "users", "--format", "hex", "--batch", "10"],
        &broken,
    )
    .await
    .failure();
    assert!(
        refused.contains("line 1001 of standard input is not hexadecimal")
            && refused.ends_with(
                "the rebuild was abandoned and the live filter of namespace \"users\" is unchanged"
            ),
        "{refused}"
    );
    assert_loaded(&server, "users", new.clone()).await;
    let partial = answers(&server, "users", keys("partial", 1_000)).await;
    assert!(
        partial.iter().filter(|a| **a == Answer::MayExist).count() < 50,
        "keys of the abandoned rebuild were swapped in"
    );

    // A namespace that really holds no keys any more is emptied when the operator says so.
    let emptied = run_with_stdin(&server, &["rebuild", "-n", "users", "--allow-empty"], b"")
        .await
        .ok();
    assert!(emptied.stderr.contains("0 keys"), "{emptied:?}");
    let now = answers(&server, "users", new).await;
    assert!(
        now.iter().filter(|a| **a == Answer::MayExist).count() < 50,
        "the filter was not emptied: {} of 2,500 keys may exist",
        now.iter().filter(|a| **a == Answer::MayExist).count()
    );
}

/// Ctrl-C in the middle of a rebuild: the gate abandons it, the live filter stays.
#[tokio::test]
async fn an_interrupted_rebuild_leaves_the_live_filter() {
    let server = start(CONFIG).await;
    let live = keys("live", 100);
    client(&server)
        .await
        .add(AddRequest {
            namespace: "users".into(),
            keys: live.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut rebuild = command(&addr(&server), &["rebuild", "-n", "users", "--batch", "10"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    // 25 keys and an open pipe: two batches go out, and the command waits for more input.
    let mut stdin = rebuild.stdin.take().unwrap();
    stdin.write_all(&lines(&keys("partial", 25))).await.unwrap();
    // Once the command catches SIGINT (it starts to just before its rebuild call), Ctrl-C is the operator
    // interrupting a rebuild under way rather than killing a process that has not begun.
    let pid = rebuild.id().expect("running");
    wait_until(PATIENCE, "the command to catch SIGINT", async || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let caught = status.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
        let mask = u64::from_str_radix(caught.trim(), 16).ok()?;
        (mask & (1 << (libc::SIGINT - 1)) != 0).then_some(())
    })
    .await;
    assert!(std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let output = rebuild.wait_with_output().await.unwrap();
    let run = Run {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    assert_eq!(
        run.failure(),
        "existence-gate: interrupted; the rebuild was abandoned and the live filter of namespace \"users\" is \
         unchanged"
    );
    drop(stdin);
    assert_loaded(&server, "users", live).await;
}

#[tokio::test]
async fn stats_print_an_aligned_table_or_json() {
    let server = start(CONFIG).await;
    run(&server, &["add", "-n", "users", "a", "b", "c"])
        .await
        .ok();
    let table = run(&server, &["stats"]).await.ok();
    let (memory, rows): (Vec<&str>, Vec<&str>) = table
        .stdout
        .lines()
        .partition(|line| line.starts_with("memory: "));
    assert_eq!(rows.len(), 3, "{table:?}");
    assert_eq!(memory.len(), 1, "{table:?}");
    assert!(
        memory[0].contains(" resident ~ filters ") && memory[0].contains(" + program "),
        "{table:?}"
    );
    assert!(rows[0].starts_with("NAMESPACE  KEYS ADDED"), "{table:?}");
    assert!(rows[1].starts_with("default "), "{table:?}");
    assert!(rows[2].starts_with("users "), "{table:?}");
    // Right-aligned figures: every row ends where the header does.
    assert!(rows.iter().all(|r| r.len() == rows[0].len()), "{table:?}");
    let users: Vec<&str> = rows[2].split_whitespace().collect();
    assert_eq!(users[1], "3", "keys added: {table:?}");

    let one = run(&server, &["stats", "-n", "users", "--json"]).await.ok();
    let stats: serde_json::Value = serde_json::from_str(&one.stdout).unwrap();
    let namespaces = stats["namespaces"].as_array().unwrap();
    assert_eq!(namespaces.len(), 1, "{stats}");
    assert_eq!(namespaces[0]["namespace"], "users");
    assert_eq!(namespaces[0]["keys_added"], 3);
    assert_eq!(namespaces[0]["seq"], 2);
    // The process's memory sums over every namespace: only in the answer for all of them.
    assert!(stats.get("memory").is_none(), "{stats}");
    let all = run(&server, &["stats", "--json"]).await.ok();
    let all: serde_json::Value = serde_json::from_str(&all.stdout).unwrap();
    assert!(
        all["memory"]["resident_bytes"].as_u64().unwrap() > 0,
        "{all}"
    );

    let missing = run(&server, &["stats", "-n", "Users"]).await.failure();
    assert_eq!(
        missing,
        "existence-gate: Stats failed: NOT_FOUND: namespace \"Users\" does not exist; check --namespace: names \
         are case-sensitive, and `existence-gate stats` lists the gate's namespaces"
    );
}

#[tokio::test]
async fn check_add_and_absent_print_answers_and_outcomes() {
    let server = start(CONFIG).await;
    let added = run(&server, &["add", "user-1", "user-2"]).await.ok();
    assert_eq!(
        added.stdout,
        "added 2 keys to namespace \"default\" at seq 2 (0 tombstones cleared)\n"
    );
    let checked = run(&server, &["check", "user-1", "nobody"]).await.ok();
    assert_eq!(
        checked.stdout,
        "user-1 MAY_EXIST FILTER\nnobody ABSENT FILTER\n"
    );

    // The source said user-2 is gone: a tombstone, which check then shows.
    let recorded = run(&server, &["absent", "user-2", "--deleted", "--ttl", "90s"])
        .await
        .ok();
    assert!(
        recorded
            .stdout
            .starts_with("user-2 RECORDED: tombstone stored at seq 3, expires in "),
        "{recorded:?}"
    );
    let redundant = run(&server, &["absent", "nobody"]).await.ok();
    assert_eq!(
        redundant.stdout,
        "nobody REDUNDANT: the filter alone already answers ABSENT for this key; nothing stored\n"
    );
    // An absence observed before an Add of the key is stale.
    let superseded = run(
        &server,
        &["absent", "user-1", "--observed-seq", "1", "--json"],
    )
    .await
    .ok();
    let outcome: serde_json::Value = serde_json::from_str(&superseded.stdout).unwrap();
    assert_eq!(outcome["outcome"], "SUPERSEDED", "{outcome}");
    assert_eq!(outcome["key"], "user-1");

    // Keys on standard input, answers as JSON lines in input order.
    let checked = run_with_stdin(&server, &["check", "--json"], b"user-2\nuser-1\nnobody\n")
        .await
        .ok();
    let answers: Vec<serde_json::Value> = checked
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), 3, "{checked:?}");
    assert_eq!(
        (
            &answers[0]["key"],
            &answers[0]["answer"],
            &answers[0]["basis"]
        ),
        (&"user-2".into(), &"ABSENT".into(), &"TOMBSTONE".into())
    );
    assert_eq!(answers[1]["answer"], "MAY_EXIST");
    assert_eq!(answers[1]["observed_seq"], 3);
    assert_eq!(answers[2]["answer"], "ABSENT");

    // Many keys, in batches of 7 several in flight: one line per key, in input order.
    let input: Vec<String> = (0..100)
        .map(|i| match i % 3 {
            0 => "user-1".to_string(),
            1 => "user-2".to_string(),
            _ => format!("nobody-{i}"),
        })
        .collect();
    let checked = run_with_stdin(
        &server,
        &["check", "--batch", "7"],
        input.join("\n").as_bytes(),
    )
    .await
    .ok();
    let lines: Vec<&str> = checked.stdout.lines().collect();
    assert_eq!(lines.len(), 100, "{checked:?}");
    let mut absent = 0;
    for (key, line) in input.iter().zip(lines) {
        match key.as_str() {
            "user-1" => assert_eq!(line, "user-1 MAY_EXIST FILTER"),
            "user-2" => assert_eq!(line, "user-2 ABSENT TOMBSTONE"),
            // Never added: ABSENT, but for the filter's false positives (1%).
            _ => {
                assert!(
                    line.starts_with(&format!("{key} ")) && line.ends_with(" FILTER"),
                    "{line}"
                );
                absent += usize::from(line.contains("ABSENT"));
            }
        }
    }
    assert!(absent >= 30, "{absent} of 33 never-added keys ABSENT");

    let bad_ttl = run(&server, &["absent", "x", "--ttl", "1500ms"])
        .await
        .failure();
    assert!(bad_ttl.contains("whole seconds"), "{bad_ttl}");
}

#[tokio::test]
async fn watch_prints_invalidations_as_json_lines_until_interrupted() {
    let server = start(CONFIG).await;
    let mut gate = client(&server).await;
    gate.add(AddRequest {
        namespace: "users".into(),
        keys: vec![Bytes::from_static(b"ghost")],
        ..Default::default()
    })
    .await
    .unwrap();
    let recorded = gate
        .record_absent(RecordAbsentRequest {
            namespace: "users".into(),
            key: Bytes::from_static(b"ghost"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(recorded.seq, 3, "a tombstone is stored");

    let mut watch = command(&addr(&server), &["watch", "--namespace", "users"])
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(watch.stderr.take().unwrap()).lines();
    let ready = stderr.next_line().await.unwrap().expect("a line on stderr");
    assert_eq!(
        ready,
        "watching namespace \"users\" after seq 0; Ctrl-C to stop"
    );
    // The key with a tombstone comes back: watchers must drop their cached absence.
    let added = gate
        .add(AddRequest {
            namespace: "users".into(),
            keys: vec![Bytes::from_static(b"ghost")],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(added.tombstones_cleared, 1);
    let mut stdout = BufReader::new(watch.stdout.take().unwrap()).lines();
    let line = stdout.next_line().await.unwrap().expect("an invalidation");
    let invalidation: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        invalidation,
        serde_json::json!({"namespace": "users", "seq": added.seq, "cause": "ADDED", "keys": ["ghost"]})
    );

    let pid = watch.id().expect("running").to_string();
    let interrupted = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert!(interrupted.success());
    let exit = watch.wait().await.unwrap();
    assert!(
        exit.success(),
        "Ctrl-C ends a watch with exit 0, not {exit:?}"
    );
}

#[tokio::test]
async fn snapshot_prints_where_the_snapshot_went() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = options(CONFIG, 16 << 20);
    options.durability = Some(existence_gate::server::DurabilityOptions::new(
        dir.path().to_path_buf(),
    ));
    let server = start_options(
        options,
        std::sync::Arc::new(existence_gate::core::clock::SystemClock),
    )
    .await;
    run(&server, &["add", "k"]).await.ok();
    let taken = run(&server, &["snapshot", "--json"]).await.ok();
    let reply: serde_json::Value = serde_json::from_str(&taken.stdout).unwrap();
    let path = reply["path"].as_str().unwrap();
    assert!(
        std::path::Path::new(path).starts_with(dir.path()),
        "{reply}"
    );
    assert_eq!(
        std::fs::metadata(path).unwrap().len(),
        reply["bytes"].as_u64().unwrap()
    );
    let text = run(&server, &["snapshot"]).await.ok();
    assert!(
        text.stdout
            .starts_with(&format!("snapshot {}", dir.path().display()))
            && text.stdout.contains(" taken in "),
        "{text:?}"
    );

    let in_memory = start(CONFIG).await;
    let refused = run(&in_memory, &["snapshot"]).await.failure();
    assert!(
        refused.starts_with("existence-gate: Snapshot failed: FAILED_PRECONDITION: "),
        "{refused}"
    );
}

#[tokio::test]
async fn a_wrong_token_is_one_line_naming_unauthenticated_and_the_fix() {
    let config = token_entry("ops", "right", &["read", "write", "admin"], &["*"]);
    let server = start(&config).await;
    for args in [
        &["stats", "--token", "wrong"][..],
        &["add", "k", "--token", "wrong"],
        &["check", "k"],
        &["watch", "--token", "wrong"],
    ] {
        let refused = run(&server, args).await.failure();
        assert!(
            refused.contains(" failed: UNAUTHENTICATED: ")
                && refused
                    .contains("pass a token the gate knows with --token or EXISTENCE_GATE_TOKEN"),
            "{args:?}: {refused}"
        );
    }
    let refused = run_with_stdin(&server, &["load", "--token", "wrong"], b"a\nb\n")
        .await
        .failure();
    assert!(
        refused.starts_with("existence-gate: Add failed: UNAUTHENTICATED: unknown token; "),
        "{refused}"
    );
    // The right token, from the environment.
    let output = command(&addr(&server), &["check", "k"])
        .env("EXISTENCE_GATE_TOKEN", "right")
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(output.stdout, b"k ABSENT FILTER\n");
}

#[tokio::test]
async fn a_gate_that_is_not_running_is_named_with_its_address() {
    let addr = format!("http://127.0.0.1:{}", free_port());
    for args in [&["stats"][..], &["load"], &["watch"], &["check", "k"]] {
        let refused = run_at(&addr, args, b"k\n").await.failure();
        assert!(
            refused.starts_with(&format!("existence-gate: cannot connect to {addr}: "))
                && refused.contains("Connection refused")
                && refused.ends_with("is the gate running, and is --addr right?"),
            "{args:?}: {refused}"
        );
    }
}

/// A gate that requires mutual TLS: the CA and the client certificate get the commands in; without the
/// certificate they are refused, in one line.
#[tokio::test]
async fn tls_flags_reach_a_gate_that_requires_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let pki = new_pki();
    let write = |name: &str, pem: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path.display().to_string()
    };
    let ca = write("ca.pem", &pki.ca);
    let mut options = options(CONFIG, 16 << 20);
    options.tls = Some(existence_gate::server::TlsOptions {
        cert: write("server.pem", &pki.server_cert).into(),
        key: write("server.key", &pki.server_key).into(),
        client_ca: Some(ca.clone().into()),
    });
    let server = start_options(
        options,
        std::sync::Arc::new(existence_gate::core::clock::SystemClock),
    )
    .await;
    let (cert, key) = (
        write("client.pem", &pki.client_cert),
        write("client.key", &pki.client_key),
    );
    let mutual = ["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key];
    let https = format!("https://localhost:{}", server.grpc_addr.port());
    let added = run_at(&https, &[&["add", "k"][..], &mutual].concat(), b"")
        .await
        .ok();
    assert!(added.stdout.starts_with("added 1 key"), "{added:?}");
    // Without a scheme, TLS flags mean https.
    let bare = format!("localhost:{}", server.grpc_addr.port());
    let checked = run_at(&bare, &[&["check", "k"][..], &mutual].concat(), b"")
        .await
        .ok();
    assert_eq!(checked.stdout, "k MAY_EXIST FILTER\n");
    let refused = run_at(&https, &["check", "k", "--tls-ca", &ca], b"")
        .await
        .failure();
    assert!(refused.starts_with("existence-gate: "), "{refused}");
    let plaintext = run_at(
        &https.replace("https", "http"),
        &["check", "k", "--tls-ca", &ca],
        b"",
    )
    .await
    .failure();
    assert_eq!(
        plaintext,
        format!(
            "existence-gate: --addr http://localhost:{} is plaintext but TLS files were given: use https://",
            server.grpc_addr.port()
        )
    );
}

/// The bootstrap from PostgreSQL: a table's ids streamed into `load` and `rebuild`, keys with COPY's escapes
/// and NULLs, and the errors an operator meets first (a missing table, a refused token).
/// Each PostgreSQL type's value becomes the key an application passes to `MayExist`: its text form as psql
/// prints it (a uuid in lowercase whatever was inserted, a numeric with its scale), and a bytea's bytes
/// themselves or in hex with `--key-format raw|hex`; a format for bytea refuses other types, naming the row.
#[tokio::test]
async fn each_column_type_gives_the_key_an_application_passes() {
    let Some(postgres) = Postgres::start().await else {
        return;
    };
    let db = postgres.client().await;
    db.batch_execute(
        "CREATE TABLE kinds (i bigint, t text, u uuid, b bytea, n numeric);
         INSERT INTO kinds VALUES
             (42, 'Café', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', '\\x00ff10', 1.50);",
    )
    .await
    .unwrap();
    let server = start(CONFIG).await;
    let dsn = postgres.dsn();
    let cases: [(&str, &str, &[u8]); 7] = [
        ("i", "text", b"42"),
        ("t", "text", "Café".as_bytes()),
        ("u", "text", b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        ("n", "text", b"1.50"),
        ("b", "text", b"\\x00ff10"),
        ("b", "hex", b"00ff10"),
        ("b", "raw", &[0x00, 0xff, 0x10]),
    ];
    for (i, (column, format, key)) in cases.into_iter().enumerate() {
        let namespace = ["users", "default"][i % 2];
        let query = format!("SELECT {column} FROM kinds");
        let args = [
            "load",
            "-n",
            namespace,
            "--postgres",
            &dsn,
            "--query",
            &query,
            "--key-format",
            format,
        ];
        run(&server, &args).await.ok();
        let answers = answers(&server, namespace, vec![Bytes::copy_from_slice(key)]).await;
        assert_eq!(answers, [Answer::MayExist], "{column} as {format}: {key:?}");
    }
    let refused = run(
        &server,
        &[
            "load",
            "--postgres",
            &dsn,
            "--query",
            "SELECT i FROM kinds",
            "--key-format",
            "raw",
        ],
    )
    .await
    .failure();
    assert!(
        refused.contains("row 1 of the query: \"42\" is not a bytea value"),
        "{refused}"
    );
}

#[tokio::test]
async fn load_and_rebuild_stream_a_postgres_query_into_the_gate() {
    let Some(postgres) = Postgres::start().await else {
        return;
    };
    let db = postgres.client().await;
    db.batch_execute(
        "CREATE TABLE users (id bigint PRIMARY KEY);
         INSERT INTO users SELECT generate_series(1, 20000);
         CREATE TABLE odd (name text);
         INSERT INTO odd VALUES ('tab\there'), (E'back\\\\slash'), (E'new\\nline'), (NULL), (''), ('plain');
         ANALYZE users;",
    )
    .await
    .unwrap();
    let server = start(CONFIG).await;
    let dsn = postgres.dsn();
    let loaded = run(
        &server,
        &[
            "load",
            "-n",
            "users",
            "--postgres",
            &dsn,
            "--query",
            "SELECT id::text FROM users;",
        ],
    )
    .await
    .ok();
    assert!(
        loaded.stderr.starts_with("loaded 20,000 keys in "),
        "{loaded:?}"
    );
    let ids: Vec<Bytes> = (1..=20_000)
        .map(|i: u32| Bytes::from(i.to_string()))
        .collect();
    assert_loaded(&server, "users", ids).await;

    let rebuilt = run(
        &server,
        &[
            "rebuild",
            "--postgres",
            &dsn,
            "--query",
            "SELECT name, 1 FROM odd",
            "--json",
        ],
    )
    .await
    .ok();
    let summary: serde_json::Value = serde_json::from_str(&rebuilt.stdout).unwrap();
    assert_eq!(
        (summary["keys"].as_u64(), summary["skipped"].as_u64()),
        (Some(4), Some(2)),
        "{summary}"
    );
    let odd: Vec<Bytes> = ["tab\there", "back\\slash", "new\nline", "plain"]
        .into_iter()
        .map(|key| Bytes::from_static(key.as_bytes()))
        .collect();
    assert_loaded(&server, "", odd).await;

    let missing = run(
        &server,
        &[
            "load",
            "--postgres",
            &dsn,
            "--query",
            "SELECT id::text FROM nope",
        ],
    )
    .await
    .failure();
    assert_eq!(
        missing,
        format!(
            "existence-gate: PostgreSQL at 127.0.0.1:{} refused the query: relation \"nope\" does not exist \
             (SQLSTATE 42P01); check --query",
            postgres.port
        )
    );

    let config = token_entry("ops", "right", &["write"], &["*"]);
    let guarded = start(&config).await;
    let refused = run(
        &guarded,
        &[
            "load",
            "--postgres",
            &dsn,
            "--query",
            "SELECT id::text FROM users",
            "--token",
            "wrong",
        ],
    )
    .await
    .failure();
    assert!(
        refused.starts_with(
            "existence-gate: Add failed: UNAUTHENTICATED: unknown token; pass a token"
        ),
        "{refused}"
    );
}

#[tokio::test]
async fn a_bad_postgres_dsn_says_what_to_fix() {
    let server = start(CONFIG).await;
    let refused = run(
        &server,
        &[
            "load",
            "--postgres",
            "port=notanumber",
            "--query",
            "SELECT 1",
        ],
    )
    .await
    .failure();
    assert!(
        refused.starts_with(
            "existence-gate: invalid --postgres port=notanumber: invalid connection string: invalid value \
             for option `port`; "
        )
            && refused.contains("write it as postgres://USER:PASSWORD@HOST:PORT/DATABASE"),
        "{refused}"
    );
    let port = free_port();
    let refused = run(
        &server,
        &[
            "load",
            "--postgres",
            &format!("postgres://someone:secret@127.0.0.1:{port}/db"),
            "--query",
            "SELECT 1",
        ],
    )
    .await
    .failure();
    assert!(
        refused.starts_with(&format!(
            "existence-gate: cannot connect to PostgreSQL at 127.0.0.1:{port}: "
        )) && refused.ends_with("is it running, and is --postgres right?")
            && !refused.contains("secret"),
        "{refused}"
    );
}
