//! A throwaway PostgreSQL 15 cluster: `initdb` into a temporary directory, served on a free loopback port with
//! `wal_level = logical` (what a change feed needs), stopped when dropped. PostgreSQL refuses to run as root,
//! so under root (as in CI) every command runs as the `postgres` system user, which owns the directory.
//! `.ci/run` installs Debian's postgresql-15 and sets `EXISTENCE_GATE_REQUIRE_POSTGRES=1`, so in CI a missing
//! installation fails the tests; elsewhere the tests that need it say so and skip.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::{wait_until, PATIENCE};

/// Where Debian installs PostgreSQL 15's server programs.
const BIN: &str = "/usr/lib/postgresql/15/bin";

/// A running cluster.
pub struct Postgres {
    bin: PathBuf,
    /// The cluster's data directory (inside `_dir`).
    data: PathBuf,
    /// Whether commands run as the `postgres` user (because this process is root).
    as_postgres: bool,
    /// The loopback port it listens on.
    pub port: u16,
    _dir: tempfile::TempDir,
}

/// The directory of PostgreSQL's programs, or `None` (with a note on stderr) when it is not installed and not
/// required.
fn binaries() -> Option<PathBuf> {
    let bin = PathBuf::from(BIN);
    let required = std::env::var("EXISTENCE_GATE_REQUIRE_POSTGRES").is_ok_and(|v| v == "1");
    match bin.join("initdb").is_file() {
        true => Some(bin),
        false if required => {
            panic!("PostgreSQL 15 is not installed in {BIN} (apt-get install -y postgresql-15)")
        }
        false => {
            eprintln!(
                "PostgreSQL 15 is not installed in {BIN} (apt-get install -y postgresql-15): skipping"
            );
            None
        }
    }
}

impl Postgres {
    /// Creates and starts a cluster and waits until it accepts connections; `None` if PostgreSQL is not
    /// installed (and not required).
    pub async fn start() -> Option<Self> {
        let bin = binaries()?;
        let dir = tempfile::tempdir().expect("a temporary directory");
        // The owner of /proc/self is this process's effective user.
        let as_postgres = std::fs::metadata("/proc/self")
            .map(|m| m.uid())
            .unwrap_or(1)
            == 0;
        if as_postgres {
            run(Command::new("chown")
                .arg("postgres:postgres")
                .arg(dir.path()));
        }
        let port = crate::free_port();
        let cluster = Self {
            bin,
            data: dir.path().join("data"),
            as_postgres,
            port,
            _dir: dir,
        };
        run(cluster
            .command("initdb")
            .arg("-D")
            .arg(&cluster.data)
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ]));
        let socket_dir = cluster
            .data
            .parent()
            .expect("the data directory has a parent");
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={} -c wal_level=logical \
             -c fsync=off -c synchronous_commit=off -c full_page_writes=off",
            socket_dir.display()
        );
        let log = socket_dir.join("postgres.log");
        let started = cluster
            .command("pg_ctl")
            .arg("-D")
            .arg(&cluster.data)
            .arg("-l")
            .arg(&log)
            .args(["-o", &options, "start"])
            .stdout(Stdio::null())
            .status()
            .expect("running pg_ctl start");
        assert!(
            started.success(),
            "PostgreSQL did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        let dsn = cluster.dsn();
        wait_until(PATIENCE, "PostgreSQL to accept connections", async || {
            tokio_postgres::connect(&dsn, tokio_postgres::NoTls)
                .await
                .ok()
                .map(|_| ())
        })
        .await;
        Some(cluster)
    }

    /// The connection string of the `postgres` database as the `postgres` user.
    pub fn dsn(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// A connected client (its connection runs on the current runtime).
    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.dsn(), tokio_postgres::NoTls)
            .await
            .expect("connects to PostgreSQL");
        tokio::spawn(connection);
        client
    }

    /// One of PostgreSQL's programs, as the `postgres` user when this process is root.
    fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            Command::new(program)
        }
    }
}

/// Runs `command` to completion, failing the test with its output if it fails.
fn run(command: &mut Command) {
    let output = command.output().expect("starting a PostgreSQL command");
    assert!(
        output.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["stop", "-m", "immediate"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
