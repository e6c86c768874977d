//! The flags of replicated mode (`--nats` and what only matters with it), turned into the server's
//! [`ReplicationOptions`].

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use existence_gate::core::config::parse_duration;
use existence_gate::replication::replica::ReplicaOptions;
use existence_gate::replication::stream::StreamOptions;
use existence_gate::server::ReplicationOptions;

/// Replicated mode: every flag but `--nats` only matters with it.
#[derive(Debug, Args)]
pub(crate) struct ReplicationArgs {
    /// NATS servers (comma-separated URLs, e.g. nats://127.0.0.1:4222): run as one replica of a deployment
    /// sharing a JetStream stream, which is then the log (no local write-ahead log).
    #[arg(long, env = "EXISTENCE_GATE_NATS", value_delimiter = ',')]
    nats: Vec<String>,
    /// A token for a NATS that requires one.
    #[arg(long, env = "EXISTENCE_GATE_NATS_TOKEN", requires = "nats")]
    nats_token: Option<String>,
    /// A NATS .creds file (JWT and NKey seed).
    #[arg(long, env = "EXISTENCE_GATE_NATS_CREDS", requires = "nats")]
    nats_creds: Option<PathBuf>,
    /// A PEM CA bundle the NATS servers' certificates chain to (TLS is then required).
    #[arg(long, env = "EXISTENCE_GATE_NATS_TLS_CA", requires = "nats")]
    nats_tls_ca: Option<PathBuf>,
    /// The JetStream stream (subjects NAME.<namespace>); the first replica creates it.
    #[arg(long, env = "EXISTENCE_GATE_NATS_STREAM", default_value = "existence")]
    nats_stream: String,
    /// Replicas of the stream when this replica creates it (3 in production).
    #[arg(long, env = "EXISTENCE_GATE_NATS_REPLICAS", default_value_t = 1)]
    nats_replicas: usize,
    /// How this replica names itself in metrics, logs and applied-seq reports (default: host name and gRPC
    /// port).
    #[arg(long, env = "EXISTENCE_GATE_REPLICA_ID")]
    replica_id: Option<String>,
    /// How long a replica may answer ABSENT after confirming it has applied the stream's end (e.g. 100ms);
    /// an Add is acknowledged at most this long after the stream stored it.
    #[arg(long, env = "EXISTENCE_GATE_READ_LEASE", default_value = "100ms", value_parser = parse_duration)]
    read_lease: std::time::Duration,
    /// Seqs behind the stream past which a replica reports NOT_SERVING (lagging).
    #[arg(long, env = "EXISTENCE_GATE_MAX_LAG", default_value_t = 10_000)]
    max_lag: u64,
    /// How much faster one replica's monotonic clock may run than another's (e.g. 1%, 0.5%, 100ppm): writers
    /// that acknowledge by the fallback wait the read lease stretched by this much.
    #[arg(long, env = "EXISTENCE_GATE_MAX_CLOCK_DRIFT", default_value = "1%", value_parser = parse_drift)]
    max_clock_drift: u64,
    /// Start on a nats-server older than 2.10, which cannot sync JetStream's store before acknowledging: a
    /// power loss of the NATS hosts can then lose acknowledged Adds, answered ABSENT afterwards. For tests
    /// of such servers only.
    #[arg(long, env = "EXISTENCE_GATE_NATS_ALLOW_UNSYNCED", requires = "nats")]
    nats_allow_unsynced: bool,
}

/// The longest `--read-lease` accepted.
const MAX_READ_LEASE: std::time::Duration = std::time::Duration::from_secs(60);

/// A clock drift in parts per million, from `1%` or `100ppm`.
fn parse_drift(text: &str) -> Result<u64, String> {
    let bad = || {
        format!("{text:?} is not a clock drift: write it as a percentage (1%) or in ppm (100ppm)")
    };
    let ppm = if let Some(percent) = text.strip_suffix('%') {
        let percent: f64 = percent.trim().parse().map_err(|_| bad())?;
        (percent * 10_000.0).round()
    } else if let Some(ppm) = text.strip_suffix("ppm") {
        ppm.trim().parse::<f64>().map_err(|_| bad())?
    } else {
        return Err(bad());
    };
    if !(0.0..=100_000.0).contains(&ppm) {
        return Err(format!(
            "{text:?} is out of range: a clock drift is 0 to 10%"
        ));
    }
    Ok(ppm as u64)
}

impl ReplicationArgs {
    pub(crate) fn options(&self, listen: SocketAddr) -> Result<Option<ReplicationOptions>, String> {
        if self.nats.is_empty() {
            return Ok(None);
        }
        if self.read_lease < std::time::Duration::from_millis(4) {
            return Err(format!(
                "--read-lease {:?} is too short: replicas renew it four times per lease over the network; \
                 use at least 4ms (100ms is the default)",
                self.read_lease
            ));
        }
        if self.read_lease > MAX_READ_LEASE {
            return Err(format!(
                "--read-lease {:?} is too long: while a replica is silent, every Add waits about one lease \
                 before it is acknowledged; use at most {MAX_READ_LEASE:?} (100ms is the default)",
                self.read_lease
            ));
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|name| name.trim().to_string())
            .unwrap_or_else(|_| "replica".to_string());
        let id = self
            .replica_id
            .clone()
            .unwrap_or_else(|| format!("{host}:{}", listen.port()));
        Ok(Some(ReplicationOptions {
            stream: StreamOptions {
                token: self.nats_token.clone(),
                credentials: self.nats_creds.clone(),
                tls_ca: self.nats_tls_ca.clone(),
                replicas: self.nats_replicas,
                allow_unsynced: self.nats_allow_unsynced,
                ..StreamOptions::new(self.nats.clone(), &self.nats_stream)
            },
            replica: ReplicaOptions {
                id,
                read_lease: self.read_lease,
                max_lag: self.max_lag,
                max_clock_drift_ppm: self.max_clock_drift,
                origin: format!("{host} pid {}", std::process::id()),
            },
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::parse_drift;

    #[test]
    fn clock_drift_takes_percent_or_ppm_and_refuses_the_rest() {
        assert_eq!(parse_drift("1%"), Ok(10_000));
        assert_eq!(parse_drift("0.5%"), Ok(5_000));
        assert_eq!(parse_drift("100ppm"), Ok(100));
        assert_eq!(parse_drift("0%"), Ok(0));
        assert!(parse_drift("1")
            .unwrap_err()
            .contains("percentage (1%) or in ppm"));
        assert!(parse_drift("11%").unwrap_err().contains("out of range"));
        assert!(parse_drift("-1%").is_err());
    }
}
