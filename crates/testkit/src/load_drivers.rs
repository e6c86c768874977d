//! The client libraries under load: each language's load driver (`clients/LANG/load.sh DIR ADDRESSES`)
//! builds its library as that language's tests do and runs four callers through it, with the library's
//! default settings — an `Add` of a new key, a lookup of it (`ABSENT` there is a false `ABSENT`), a lookup of a
//! key nobody adds — until told to stop. What a balancer test needs of them: started against some addresses,
//! waited for until every caller has an `Add` acknowledged, stopped, and their failures each with its time, so
//! that a test can say which event cost what.
//!
//! The protocol is files in a directory of the driver's own: `started` once every caller has had 20 `Add`s
//! acknowledged (the load is steady: a channel's first calls may miss the default deadline while it
//! connects), `stop` (written here) to end it, then `report`: `calls=N failed=N false_absent=N` and a line
//! per failed call or false `ABSENT`, `UNIX_MS what`. A driver whose toolchain is missing exits 77 (as the
//! client test scripts do): skipped with a note, or a failure where `EXISTENCE_GATE_REQUIRE_INTEROP=1`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{wait_until, workspace_root, PATIENCE};

/// The languages whose libraries a balancer test runs.
pub const LANGUAGES: [&str; 3] = ["go", "python", "java"];

/// How long a driver may take to build its library and get every caller's first `Add` acknowledged: a
/// Maven build from Debian's repository takes most of a minute on a loaded 2-core machine.
const BUILD_PATIENCE: Duration = Duration::from_secs(600);

/// One language's load driver, running.
pub struct LoadDriver {
    /// The language (`clients/<lang>/load.sh`).
    pub lang: &'static str,
    dir: tempfile::TempDir,
    child: tokio::process::Child,
    log: PathBuf,
}

/// What a driver saw, once stopped.
#[derive(Debug, Clone, Default)]
pub struct DriverReport {
    /// The language.
    pub lang: &'static str,
    /// Calls made (`Add`s and lookups).
    pub calls: u64,
    /// Calls that failed.
    pub failed: u64,
    /// Lookups of an acknowledged key answered `ABSENT`.
    pub false_absent: u64,
    /// Each failed call or false `ABSENT`: when (Unix ms), and what.
    pub events: Vec<(u64, String)>,
}

impl DriverReport {
    /// The failures and false `ABSENT`s between `from` and `to` (Unix ms).
    pub fn between(&self, from: u64, to: u64) -> Vec<&str> {
        self.events
            .iter()
            .filter(|(at, _)| (from..to).contains(at))
            .map(|(_, what)| what.as_str())
            .collect()
    }
}

/// Now, in Unix ms: what drivers stamp their failures with.
pub fn unix_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

impl LoadDriver {
    /// Starts `lang`'s driver against `addresses` (joined by commas); waits until its load is steady. `None` (with a note) where its toolchain is missing and not required.
    pub async fn start(lang: &'static str, addresses: &str) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let log = std::env::temp_dir().join(format!(
            "existence-gate-load-{lang}-{}.log",
            std::process::id()
        ));
        let output = std::fs::File::create(&log).unwrap();
        let child = tokio::process::Command::new("bash")
            .arg(workspace_root().join(format!("clients/{lang}/load.sh")))
            .arg(dir.path())
            .arg(addresses)
            .stdin(Stdio::null())
            .stdout(output.try_clone().unwrap())
            .stderr(output)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("bash runs clients/{lang}/load.sh: {e}"));
        let mut driver = Self {
            lang,
            dir,
            child,
            log,
        };
        let started = driver.dir.path().join("started");
        let exited = wait_until(
            BUILD_PATIENCE,
            &format!("the {lang} load driver to start"),
            async || {
                if started.exists() {
                    return Some(None);
                }
                driver.child.try_wait().unwrap().map(Some)
            },
        )
        .await;
        match exited {
            None => Some(driver),
            Some(status) if status.code() == Some(77) => {
                let required =
                    std::env::var("EXISTENCE_GATE_REQUIRE_INTEROP").is_ok_and(|v| v == "1");
                let output = driver.output();
                assert!(
                    !required,
                    "the {lang} load driver's toolchain is missing and EXISTENCE_GATE_REQUIRE_INTEROP=1:\n{output}"
                );
                eprintln!("note: {}", output.trim());
                None
            }
            Some(status) => panic!(
                "the {lang} load driver exited {status} before it started:\n{}",
                driver.output()
            ),
        }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops the callers and reads their report.
    pub async fn finish(mut self) -> DriverReport {
        std::fs::write(self.dir.path().join("stop"), "").unwrap();
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the {} load driver did not stop", self.lang))
            .unwrap();
        let report = std::fs::read_to_string(self.dir.path().join("report"));
        let _ = std::fs::remove_file(&self.log);
        let report = match (status.success(), report) {
            (true, Ok(report)) => report,
            (_, report) => panic!(
                "the {} load driver exited {status} (report: {report:?}):\n{}",
                self.lang,
                self.output()
            ),
        };
        parse(self.lang, &report)
    }
}

/// Reads a driver's `report` file.
fn parse(lang: &'static str, report: &str) -> DriverReport {
    let mut lines = report.lines();
    let mut parsed = DriverReport {
        lang,
        ..DriverReport::default()
    };
    for field in lines.next().unwrap_or_default().split_whitespace() {
        let (name, value) = field
            .split_once('=')
            .unwrap_or_else(|| panic!("{lang}: a report field without `=`: {field:?}"));
        let value = value.parse().unwrap();
        match name {
            "calls" => parsed.calls = value,
            "failed" => parsed.failed = value,
            "false_absent" => parsed.false_absent = value,
            other => panic!("{lang}: an unknown report field {other:?}"),
        }
    }
    parsed.events = lines
        .map(|line| {
            let (at, what) = line.split_once(' ').unwrap_or((line, ""));
            (at.parse().unwrap_or(0), what.to_string())
        })
        .collect();
    parsed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_read_field_by_field_with_each_failure_and_its_time() {
        let report = parse(
            "go",
            "calls=12 failed=2 false_absent=1\n1000 Add go-0-1: UNAVAILABLE\n2000 false ABSENT for go-1-1\n",
        );
        assert_eq!(
            (report.calls, report.failed, report.false_absent),
            (12, 2, 1)
        );
        assert_eq!(report.between(0, 1500), vec!["Add go-0-1: UNAVAILABLE"]);
        assert_eq!(report.between(1500, 3000), vec!["false ABSENT for go-1-1"]);
    }
}
