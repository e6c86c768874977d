//! The results: `benches/results/replicated.md`.

use std::fmt::Write as _;
use std::time::Duration;

use crate::deployment::{REPLICAS, STREAM};
use crate::drive::Sample;
use crate::text::{latency, load_average, machine, si, today};

/// Distinct log lines quoted at most, and how much of each.
const QUOTED_LINES: usize = 20;
const QUOTED_CHARS: usize = 400;

/// The measured writes of one deployment.
pub struct Writes {
    /// What was written: keys per call and calls in flight.
    pub workload: &'static str,
    pub stream: &'static str,
    /// Latencies sorted; server CPU is the whole deployment's.
    pub sample: Sample,
    /// Calls per second of each stretch.
    pub rates: Vec<f64>,
    /// CPU seconds of the replicas alone.
    pub replicas_cpu: f64,
    /// Adds acknowledged because the read lease passed rather than because every replica applied them.
    pub acked_by_lease: f64,
    /// Mean seconds from publish to JetStream's acknowledgement, from the replicas' histograms.
    pub publish_ack_mean: f64,
    /// Mean seconds from that acknowledgement until the replica called had applied the write.
    pub apply_wait_mean: f64,
    /// Mean seconds from then until the write could be acknowledged (every member reported it, or the
    /// fallback passed).
    pub members_wait_mean: f64,
    /// Mean `Add` calls per stream message.
    pub adds_per_message: f64,
    pub errors: Vec<(String, u64)>,
}

/// Lookups against some of a deployment's replicas.
pub struct Reads {
    pub workload: &'static str,
    /// Replicas the clients were spread over.
    pub replicas: usize,
    /// Latencies sorted; server CPU is the whole deployment's.
    pub sample: Sample,
    /// Calls per second of each stretch.
    pub rates: Vec<f64>,
    /// CPU seconds of the replicas read.
    pub replicas_cpu: f64,
    /// Calls answered without a read lease (`WARMING`).
    pub fail_open: u64,
    pub errors: Vec<(String, u64)>,
}

/// One stopped replica catching up.
pub struct CatchUp {
    pub stream: &'static str,
    pub workload: &'static str,
    /// Calls in flight while it was stopped.
    pub in_flight: usize,
    /// Stream messages written while it was stopped.
    pub mutations: u64,
    /// The Adds written meanwhile through the other replicas.
    pub write: Sample,
    pub acked_by_lease: f64,
    pub stopped_for: Duration,
    /// From SIGCONT until its applied seq reached the stream's last seq, and until it served again.
    pub caught_up: Duration,
    pub serving: Duration,
    pub errors: Vec<(String, u64)>,
}

/// A deployment with nothing to do.
pub struct Idle {
    pub stream: &'static str,
    /// CPU milliseconds per second of one replica (the mean of the three).
    pub replica_ms_per_s: f64,
    /// Of all its NATS servers together.
    pub nats_ms_per_s: f64,
}

/// Everything one run measured.
pub struct Report {
    write_rounds: u64,
    read_rounds: usize,
    read_in_flight: usize,
    load_at_start: String,
    /// Each deployment's command lines.
    pub commands: Vec<(&'static str, Vec<String>)>,
    /// The replicas' configuration file.
    pub config: String,
    pub idle: Vec<Idle>,
    pub writes: Vec<Writes>,
    pub catch_up: Vec<CatchUp>,
    pub reads: Vec<Reads>,
    /// Warnings and errors the processes logged, with counts.
    pub warnings: Vec<(String, usize)>,
    /// Each replica's stretches of health `NOT_SERVING` once up, in seconds: (stream, replica, lengths).
    pub not_serving: Vec<(&'static str, &'static str, Vec<f64>)>,
    pub elapsed: Duration,
}

/// CPU microseconds per call.
fn per_call(cpu_seconds: f64, calls: u64) -> f64 {
    cpu_seconds * 1e6 / calls.max(1) as f64
}

fn errors_cell(errors: &[(String, u64)]) -> u64 {
    errors.iter().map(|(_, n)| n).sum()
}

/// The lowest and highest of `rates` (per second), scaled by `scale` (keys per call).
fn range(rates: &[f64], scale: f64) -> String {
    let (low, high) = rates
        .iter()
        .fold((f64::MAX, 0.0f64), |(lo, hi), &r| (lo.min(r), hi.max(r)));
    format!("{}–{}", si(low * scale), si(high * scale))
}

/// This process's nice value (field 19 of `/proc/self/stat`): the bench's processes and the deployments'
/// all run at it, against the machine's other work.
fn niceness() -> i64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    // After the name, field 3 (state) is index 0.
    after_name
        .split_whitespace()
        .nth(16)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

impl Report {
    pub fn new(write_rounds: u64, read_rounds: usize, read_in_flight: usize) -> Self {
        Self {
            write_rounds,
            read_rounds,
            read_in_flight,
            load_at_start: load_average(),
            commands: Vec::new(),
            config: String::new(),
            idle: Vec::new(),
            writes: Vec::new(),
            catch_up: Vec::new(),
            reads: Vec::new(),
            warnings: Vec::new(),
            not_serving: Vec::new(),
            elapsed: Duration::ZERO,
        }
    }

    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let w = &mut out;
        self.write_method(w);
        self.write_writes(w);
        self.write_catch_up(w);
        self.write_reads(w);
        self.write_idle(w);
        self.write_not_serving(w);
        self.write_failures(w);
        self.write_commands(w);
        out
    }

    fn write_method(&self, w: &mut String) {
        let _ = writeln!(w, "# Replicated mode results\n");
        let _ = writeln!(
            w,
            "`cargo bench --bench replicated`, {} — {}; load average {} at the start, {} at the end; the run \
             took {:.0} s at nice {}.\n",
            today(),
            machine(),
            self.load_at_start,
            load_average(),
            self.elapsed.as_secs_f64(),
            niceness()
        );
        let _ = writeln!(
            w,
            "**The machine is shared and noisy**: other work may take up to a core during a run (the \"other \
             load\" columns: cores busy outside the harness and the deployment measured, kernel time charged \
             to no process included), so absolute figures \
             vary from run to run. Figures in one table were measured in alternating stretches of this run, so \
             a change in the machine's load hits every row alike.\n"
        );
        let _ = writeln!(
            w,
            "Two deployments, each its own processes on loopback ports (the exact commands and the \
             configuration are at the end):\n\n\
             - **R1**: one `nats-server -js`; the stream `{STREAM}` with one copy (`--nats-replicas 1`); {REPLICAS} \
             replicas.\n\
             - **R3**: three `nats-server -js` in one JetStream cluster; the stream replicated on all three \
             (`--nats-replicas 3`); {REPLICAS} replicas, each given the three servers' URLs.\n\n\
             Replicas run with the defaults `--read-lease 100ms` and `--max-lag 10000`. The load generator is \
             this bench (tonic clients on one tokio runtime), one call in flight per HTTP/2 connection. \
             **Latency** is per call, from send to answer, every call of a case pooled over its stretches (p50 \
             is the median call); for an `Add` that is the acknowledgement: \
             published to JetStream and acknowledged by it, applied by the replica called, and applied by every \
             replica heard from within two leases (or one lease passed since the publish acknowledgement). \
             **CPU** is user + system time from `/proc/<pid>/stat` per call: \"deployment\" is its replicas and \
             NATS servers together.\n"
        );
        let _ = writeln!(
            w,
            "**This machine has 2 cores.** Both deployments (4 nats-servers, 6 replicas) and the load generator \
             share them, so throughput is bounded by the machine, not by the deployment, and reads cannot \
             scale with replicas here: each replica added shares the same two cores with the others, the NATS \
             server and the load generator. CPU per call is the figure that carries over to replicas on \
             machines of their own.\n"
        );
    }

    fn write_writes(&self, w: &mut String) {
        let _ = writeln!(
            w,
            "## Writes: `Add`\n\n\
             16-byte keys, each call new ones, to `default` through all three replicas, one call on each \
             connection, in {} stretches alternating R1 and R3 after 50 unmeasured calls: single-key Adds \
             (one connection per replica: how soon a key is acknowledged; thirty per replica: many callers \
             adding a key each), then 1,000-key Adds (three per replica: throughput). \"Adds per message\": \
             small Adds reaching a replica during a publish share the next message \
             (`existence_replica_adds_per_message`). A message's time at the replica called, in three means: publish to JetStream's \
             acknowledgement (`existence_replica_publish_ack_duration_seconds`), then until that replica has \
             applied it (`..._apply_wait_duration_seconds`), then until every member has reported it or the \
             fallback passed (`..._members_wait_duration_seconds`); \"acked by fallback\" counts Adds answered \
             because the fallback (read lease x (1 + drift) + 1 ms) passed rather than because every member \
             reported them (`existence_replica_acked_by_lease_total`).\n",
            self.write_rounds
        );
        let _ = writeln!(
            w,
            "| Add | stream | calls | keys/s | keys/s by stretch | Adds/s | p50 | p99 | p99.9 | max | Adds per message | mean: publish ack | applied here | \
             members | acked by fallback | CPU µs/Add: deployment | replicas | nats | client CPU µs/Add | other load (cores) | errors |"
        );
        let _ = writeln!(
            w,
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for x in &self.writes {
            let s = &x.sample;
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {} |",
                x.workload,
                x.stream,
                s.calls,
                si(s.keys_per_second()),
                range(&x.rates, s.keys as f64 / s.calls.max(1) as f64),
                si(s.calls_per_second()),
                latency(s.latency_us(0.5)),
                latency(s.latency_us(0.99)),
                latency(s.latency_us(0.999)),
                latency(s.latency_us(1.0)),
                x.adds_per_message,
                latency(x.publish_ack_mean * 1e6),
                latency(x.apply_wait_mean * 1e6),
                latency(x.members_wait_mean * 1e6),
                x.acked_by_lease,
                s.server_us_per_call(),
                per_call(x.replicas_cpu, s.calls),
                per_call(s.server_cpu - x.replicas_cpu, s.calls),
                s.client_us_per_call(),
                s.other_cores(),
                errors_cell(&x.errors)
            );
        }
        let _ = writeln!(w);
    }

    fn write_catch_up(&self, w: &mut String) {
        let in_flight = self.catch_up.first().map_or(0, |c| c.in_flight);
        let _ = writeln!(
            w,
            "## Catch-up\n\n\
             Replica r2 stopped (SIGSTOP) once it had applied the stream's end; the Adds written through r0 and \
             r1 ({in_flight} calls in flight, {} connections per replica), then SIGCONT. \"Caught up\" is from SIGCONT \
             until r2's `existence_replica_applied_seq` reached the stream's last seq, polled every 10 ms (the \
             gauge is refreshed every 20 ms, so this is up to ~30 ms late); \"serving\" until its gRPC health \
             was `SERVING` again. A mutation is one stream message (one Add call whatever its keys, or small ones that shared it). R3 is \
             measured first, then stopped; then R1.\n",
            in_flight / (REPLICAS - 1)
        );
        let _ = writeln!(
            w,
            "| stream | written while stopped | mutations | keys | written in | Adds/s while stopped | acked by \
             lease | stopped for | caught up in | mutations/s | keys/s | serving after | errors |"
        );
        let _ = writeln!(
            w,
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for c in &self.catch_up {
            let seconds = c.caught_up.as_secs_f64();
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {:.2} s | {} | {:.0} | {:.2} s | {:.3} s | {} | {} | {:.3} s | {} |",
                c.stream,
                c.workload,
                c.mutations,
                c.write.keys,
                c.write.wall,
                si(c.write.calls_per_second()),
                c.acked_by_lease,
                c.stopped_for.as_secs_f64(),
                seconds,
                si(c.mutations as f64 / seconds),
                si(c.write.keys as f64 / seconds),
                c.serving.as_secs_f64(),
                errors_cell(&c.errors)
            );
        }
        let _ = writeln!(w);
    }

    fn write_reads(&self, w: &mut String) {
        let _ = writeln!(
            w,
            "## Reads (R1)\n\n\
             {} calls in flight spread evenly over the first one, two or three replicas of the R1 deployment \
             (one connection per call in flight), the six cases in {} alternating stretches of a fixed number \
             of calls. Half the keys were added by the writes above, half never added (about 1% of those \
             pass the filter, its false-positive rate). \"Fail-open\" counts calls answered without a \
             read lease (`MAY_EXIST` + `WARMING`; for a batch: not one key `ABSENT`).\n",
            self.read_in_flight, self.read_rounds
        );
        let _ = writeln!(
            w,
            "| workload | replicas read | calls | calls/s | calls/s by stretch | keys/s | p50 | p99 | p99.9 | CPU µs/call: replicas \
             read | deployment | deployment cores busy | client CPU µs/call | other load (cores) | fail-open | \
             errors |"
        );
        let _ = writeln!(
            w,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for r in &self.reads {
            let s = &r.sample;
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.2} | {:.1} | {:.2} | {} | {} |",
                r.workload,
                r.replicas,
                s.calls,
                si(s.calls_per_second()),
                range(&r.rates, 1.0),
                si(s.keys_per_second()),
                latency(s.latency_us(0.5)),
                latency(s.latency_us(0.99)),
                latency(s.latency_us(0.999)),
                per_call(r.replicas_cpu, s.calls),
                s.server_us_per_call(),
                s.server_cores(),
                s.client_us_per_call(),
                s.other_cores(),
                r.fail_open,
                errors_cell(&r.errors)
            );
        }
        let _ = writeln!(w);
    }

    fn write_idle(&self, w: &mut String) {
        let _ = writeln!(
            w,
            "## At rest\n\n\
             CPU with no calls, both deployments up (before the writes): a replica reports its applied seq every \
             quarter lease (25 ms) and, with no lookup asking for its lease, publishes one barrier a second to \
             stay ready.\n"
        );
        let _ = writeln!(w, "| stream | one replica | its NATS servers |");
        let _ = writeln!(w, "|---|---:|---:|");
        for i in &self.idle {
            let _ = writeln!(
                w,
                "| {} | {:.1} ms CPU/s | {:.1} ms CPU/s |",
                i.stream, i.replica_ms_per_s, i.nats_ms_per_s
            );
        }
        let _ = writeln!(w);
    }

    /// How often, and how long, replicas were `NOT_SERVING` once up.
    fn write_not_serving(&self, w: &mut String) {
        let _ = writeln!(
            w,
            "## Replicas not serving\n\n\
             Stretches of gRPC health `NOT_SERVING` once the deployment was up, from the replicas' logs (each \
             change is logged): a replica without a read lease (it could not confirm within the lease that it \
             has the stream's end) answers lookups `MAY_EXIST` + `WARMING`, correct but a read of the source \
             for the caller. r2's include its two catch-ups (stopped on purpose, then behind).\n"
        );
        let _ = writeln!(w, "| stream | replica | stretches | total | longest |");
        let _ = writeln!(w, "|---|---|---:|---:|---:|");
        for (stream, replica, stretches) in &self.not_serving {
            let (total, longest) = match stretches.len() {
                0 => ("–".to_string(), "–".to_string()),
                _ => (
                    latency(stretches.iter().sum::<f64>() * 1e6),
                    latency(stretches.iter().copied().fold(0.0, f64::max) * 1e6),
                ),
            };
            let _ = writeln!(
                w,
                "| {stream} | {replica} | {} | {total} | {longest} |",
                stretches.len()
            );
        }
        let _ = writeln!(w);
    }

    /// Every failed call's message, and the warnings and errors the processes logged.
    fn write_failures(&self, w: &mut String) {
        let _ = writeln!(w, "## Failed calls and logged warnings\n");
        let failed: Vec<String> = self
            .writes
            .iter()
            .flat_map(|x| quote(&format!("writes, {}", x.stream), &x.errors))
            .chain(self.catch_up.iter().flat_map(|c| {
                quote(
                    &format!("catch-up, {}, {}", c.stream, c.workload),
                    &c.errors,
                )
            }))
            .chain(self.reads.iter().flat_map(|r| {
                quote(
                    &format!("reads, {}, {} replicas", r.workload, r.replicas),
                    &r.errors,
                )
            }))
            .collect();
        if failed.is_empty() {
            let _ = writeln!(w, "No call failed.\n");
        } else {
            let _ = writeln!(w, "Failed calls (status: message):\n");
            failed.iter().for_each(|line| {
                let _ = writeln!(w, "{line}");
            });
            let _ = writeln!(w);
        }
        if self.warnings.is_empty() {
            let _ = writeln!(
                w,
                "No process logged a warning or an error (replicas at `RUST_LOG=info`, nats-server at its \
                 default level).\n"
            );
            return;
        }
        let _ = writeln!(
            w,
            "Warnings and errors logged (replicas at `RUST_LOG=info`, nats-server at its default level; \
             timestamps removed and numbers written N, repeats counted; at most {QUOTED_LINES} distinct \
             lines):\n\n```text"
        );
        for (line, count) in self.warnings.iter().take(QUOTED_LINES) {
            let line: String = line.chars().take(QUOTED_CHARS).collect();
            let _ = writeln!(w, "{count:>6}x {line}");
        }
        let _ = writeln!(w, "```\n");
    }

    fn write_commands(&self, w: &mut String) {
        let _ = writeln!(
            w,
            "## Commands and configuration\n\n\
             `$DIR` is the deployment's temporary directory; ports are those of this run (free loopback \
             ports). The replicas' `--config`:\n\n```toml\n{}```\n",
            self.config
        );
        for (stream, commands) in &self.commands {
            let _ = writeln!(w, "{stream}:\n\n```sh");
            commands.iter().for_each(|c| {
                let _ = writeln!(w, "{c}");
            });
            let _ = writeln!(w, "```\n");
        }
    }
}

/// `- where: N× message` for each message of `errors`.
fn quote(place: &str, errors: &[(String, u64)]) -> Vec<String> {
    errors
        .iter()
        .map(|(message, count)| format!("- {place}: {count}× `{message}`"))
        .collect()
}
