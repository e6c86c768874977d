//! The conformance cases every client library runs (`clients/conformance/cases.txt`, the behaviours of
//! `clients/README.md` written once), run here against the real gate served in-process on loopback ports.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use existence_gate_client::{
    AddressPolicy, ClientOptions, GateClient, GatedReader, ReaderOptions, SourceRead, Stats,
};

// How long an `eventually` line may take before the case fails: the binary's PATIENCE.
use super::{closed_address, start_gate, PATIENCE};

const CASES: &str = include_str!("../../../conformance/cases.txt");
const GATE: &str = include_str!("../../../conformance/gate.toml");

/// One case of the file: its number, name and lines (split into words), each with its line number.
struct Case {
    number: usize,
    name: String,
    lines: Vec<(usize, Vec<String>)>,
}

fn cases() -> Vec<Case> {
    let mut cases: Vec<Case> = Vec::new();
    for (index, line) in CASES.lines().enumerate() {
        let words: Vec<String> = line
            .split('#')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .map(str::to_string)
            .collect();
        match words.first().map(String::as_str) {
            None => {}
            Some("case") => cases.push(Case {
                number: cases.len() + 1,
                name: words[1..].join(" "),
                lines: Vec::new(),
            }),
            Some(_) => cases
                .last_mut()
                .expect("a line before the first case")
                .lines
                .push((index + 1, words)),
        }
    }
    cases
}

/// The words before and after `->`.
fn split_arrow(words: &[String]) -> (&[String], &[String]) {
    let arrow = words
        .iter()
        .position(|w| w == "->")
        .expect("a line with `->`");
    (&words[..arrow], &words[arrow + 1..])
}

/// A status code as the cases name it (`INVALID_ARGUMENT`).
fn code_name(code: tonic::Code) -> String {
    let mut name = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

/// The counter `name` of `stats`.
fn counter(stats: &Stats, name: &str) -> u64 {
    match name {
        "lookups" => stats.lookups,
        "gate_calls" => stats.gate_calls,
        "batched_keys" => stats.batched_keys,
        "retries" => stats.retries,
        "cache_hits" => stats.cache_hits,
        "fail_opens" => stats.fail_opens,
        "source_reads" => stats.source_reads,
        "absences_recorded" => stats.absences_recorded,
        "invalidations" => stats.invalidations,
        "resubscribes" => stats.resubscribes,
        other => panic!("no counter {other}"),
    }
}

type Table = Arc<Mutex<HashMap<Bytes, String>>>;

/// A case being run: its options until the first call, then its client (and reader).
struct Run<'a> {
    case: &'a Case,
    gate: String,
    dead: String,
    options: ClientOptions,
    addresses: Vec<String>,
    client: Option<GateClient>,
    reader: Option<GatedReader<String, std::convert::Infallible>>,
    table: Table,
}

impl Run<'_> {
    fn key(&self, word: &str) -> Bytes {
        match word {
            "<empty>" => Bytes::new(),
            "<oversized>" => Bytes::from(vec![b'x'; 1_025]),
            word => Bytes::from(format!("{}:{word}", self.case.number)),
        }
    }

    fn client(&mut self) -> GateClient {
        let addresses = self.addresses.clone();
        let options = self.options.clone();
        self.client
            .get_or_insert_with(|| GateClient::new(addresses, options).expect("valid addresses"))
            .clone()
    }

    fn reader(&self) -> &GatedReader<String, std::convert::Infallible> {
        self.reader.as_ref().expect("a `reader` line first")
    }

    fn stats(&self) -> Stats {
        match (&self.reader, &self.client) {
            (Some(reader), _) => reader.stats(),
            (None, Some(client)) => client.stats(),
            (None, None) => panic!("stats before any call"),
        }
    }

    async fn line(&mut self, words: &[String]) {
        match words[0].as_str() {
            "option" => self.option(&words[1], &words[2]),
            "add" => {
                let keys: Vec<Bytes> = words[1..].iter().map(|w| self.key(w)).collect();
                self.client()
                    .add(keys)
                    .await
                    .expect("the Add is acknowledged");
            }
            "lookup" => self.lookup(words).await,
            "many" => self.many(words).await,
            "stats" => self.check_stats(&words[1..]),
            "reader" => self.start_reader(),
            "row" => {
                let key = self.key(&words[1]);
                self.table.lock().unwrap().insert(key, words[2].clone());
            }
            "get" => {
                let (question, answer) = split_arrow(&words[1..]);
                assert_eq!(self.get(&question[0]).await, answer[0]);
            }
            "eventually" => self.eventually(&words[1..]).await,
            other => panic!("no such line: {other}"),
        }
    }

    fn option(&mut self, name: &str, value: &str) {
        assert!(self.client.is_none(), "options come before the first call");
        match name {
            "coalesce_window_ms" => {
                self.options.coalesce_window = Duration::from_millis(value.parse().unwrap())
            }
            "deadline_ms" => self.options.deadline = Duration::from_millis(value.parse().unwrap()),
            "namespace" => self.options.namespace = value.to_string(),
            "address_policy" => {
                self.options.address_policy = match value {
                    "pick_first" => AddressPolicy::PickFirst,
                    "round_robin" => AddressPolicy::RoundRobin,
                    other => panic!("no address policy {other}"),
                }
            }
            "addresses" => {
                self.addresses = value
                    .split(',')
                    .map(|a| match a {
                        "gate" => self.gate.clone(),
                        "dead" => self.dead.clone(),
                        other => panic!("no address {other}"),
                    })
                    .collect()
            }
            other => panic!("no option {other}"),
        }
    }

    async fn lookup(&mut self, words: &[String]) {
        let (keys, expected) = split_arrow(&words[1..]);
        let client = self.client();
        let lookups = keys.iter().map(|k| client.may_exist(self.key(k)));
        let results = futures_util::future::join_all(lookups).await;
        let answers: Vec<String> = results
            .into_iter()
            .map(|result| match result {
                Ok(lookup) => lookup.may_exist.to_string(),
                Err(status) => code_name(status.code()),
            })
            .collect();
        assert_eq!(answers, expected, "answers for {keys:?}");
    }

    async fn many(&mut self, words: &[String]) {
        let (question, calls) = split_arrow(&words[1..]);
        let (count, prefix) = (question[0].parse::<usize>().unwrap(), &question[1]);
        let names: Vec<String> = (0..count).map(|i| format!("{prefix}{i}")).collect();
        let keys: Vec<Bytes> = names.iter().map(|n| self.key(n)).collect();
        let client = self.client();
        let before = client.stats().gate_calls;
        let answers = client.may_exist_many(&keys).await.expect("the lookups");
        assert_eq!(answers.may_exist.len(), count);
        let added = self.case.lines.iter().filter(|(_, w)| w[0] == "add");
        for name in added.flat_map(|(_, w)| w[1..].iter()) {
            let i = names.iter().position(|n| n == name).expect("an added key");
            assert!(answers.may_exist[i], "{name} was added");
        }
        let sent = client.stats().gate_calls - before;
        assert_eq!(sent.to_string(), calls[0], "calls sent");
    }

    fn check_stats(&self, checks: &[String]) {
        let stats = self.stats();
        for check in checks {
            let (name, at_least, value) = match check.split_once(">=") {
                Some((name, value)) => (name, true, value),
                None => {
                    let (name, value) = check.split_once('=').expect("NAME=N or NAME>=N");
                    (name, false, value)
                }
            };
            let (actual, wanted) = (counter(&stats, name), value.parse::<u64>().unwrap());
            let holds = if at_least {
                actual >= wanted
            } else {
                actual == wanted
            };
            assert!(holds, "{check}: {name} is {actual} ({stats:?})");
        }
    }

    fn start_reader(&mut self) {
        let table = Arc::clone(&self.table);
        let reader = GatedReader::new(
            self.client(),
            ReaderOptions::default(),
            move |key: Bytes| {
                let row = table.lock().unwrap().get(&key).cloned();
                async move {
                    Ok(match row {
                        Some(value) => SourceRead::Found(value),
                        None => SourceRead::Missing,
                    })
                }
            },
        );
        self.reader = Some(reader);
    }

    async fn get(&self, word: &str) -> String {
        let value = self.reader().get(self.key(word)).await.expect("the get");
        value.unwrap_or_else(|| "missing".to_string())
    }

    async fn eventually(&self, words: &[String]) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let holds = match words[0].as_str() {
                "get" => {
                    let (question, answer) = split_arrow(&words[1..]);
                    self.get(&question[0]).await == answer[0]
                }
                "cached" => {
                    let hits = self.reader().stats().cache_hits;
                    assert_eq!(self.get(&words[1]).await, "missing");
                    self.reader().stats().cache_hits > hits
                }
                other => panic!("no such eventually: {other}"),
            };
            if holds {
                return;
            }
            assert!(Instant::now() < deadline, "not within {PATIENCE:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_conformance_case_holds() {
    let server = start_gate(GATE, "127.0.0.1:0", None, None).await;
    let gate = server.grpc_addr.to_string();
    let dead = closed_address();
    let cases = cases();
    assert!(cases.len() >= 10, "the cases file was read");
    for case in &cases {
        let mut run = Run {
            case,
            gate: gate.clone(),
            dead: dead.clone(),
            options: ClientOptions {
                deadline: Duration::from_secs(10),
                ..ClientOptions::namespace("users")
            },
            addresses: vec![gate.clone()],
            client: None,
            reader: None,
            table: Table::default(),
        };
        for (line, words) in &case.lines {
            let running = std::panic::AssertUnwindSafe(run.line(words));
            if let Err(panic) = futures_util::FutureExt::catch_unwind(running).await {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!(
                    "case {} ({}), cases.txt line {line} `{}`: {why}",
                    case.number,
                    case.name,
                    words.join(" ")
                );
            }
        }
        if let Some(reader) = &run.reader {
            reader.close();
        }
    }
    server.stop().await.unwrap();
}
