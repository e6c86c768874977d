//! Suites written in other languages, run from cargo tests: a bash script (tests/interop/run.sh,
//! clients/LANG/test.sh) started with the server binary built by this `cargo test`, bounded in time, its
//! output shown when the test fails.
//!
//! A script exits 0 when everything passed and 77 when its toolchain is missing (printing a line starting
//! with `SKIPPED:`). A skip passes with a loud message, unless `EXISTENCE_GATE_REQUIRE_INTEROP=1` (as in
//! CI), where it fails. `.ci/install-interop` installs every toolchain.

use std::fs::File;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::thread::sleep;
use std::time::{Duration, Instant};

/// The languages share two cores: one compiles and runs at a time (within one test binary).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The script bounds every step; this bounds a whole run, whatever happens inside it.
const BUDGET: Duration = Duration::from_secs(900);

/// A script's status when nothing failed but its toolchain was missing.
const SKIPPED: i32 = 77;

/// Writes past the test harness's capture, so the line shows even when the test passes.
fn announce(text: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "{text}");
    let _ = stderr.flush();
}

/// Ends the script and everything it started (its own process group): TERM first, so it stops its servers.
fn stop_group(pid: u32) {
    let group = format!("-{pid}");
    let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
    sleep(Duration::from_secs(10));
    let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
}

/// Runs `bash SCRIPT ARGS` (relative to the checkout) within the budget: its exit status (None on timeout)
/// and its output.
fn run_script(script: &str, args: &[&str]) -> (Option<ExitStatus>, String) {
    // Resolved at run time: a binary reused from a shared target folder runs this checkout's scripts.
    let root = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(crate::workspace_root, std::path::PathBuf::from);
    let log_path = std::env::temp_dir().join(format!(
        "existence-gate-{}-{}.log",
        script.replace('/', "-"),
        std::process::id()
    ));
    let log = File::create(&log_path).expect("creates the log file");
    let mut child = Command::new("bash")
        .arg(root.join(script))
        .args(args)
        .env("EXISTENCE_GATE_BIN", crate::binary::path())
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clones the log handle"))
        .stderr(log)
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("bash runs {script}: {e}"));
    let deadline = Instant::now() + BUDGET;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waits for the script") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            stop_group(child.id());
            let _ = child.wait();
            break None;
        }
        sleep(Duration::from_millis(100));
    };
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    let _ = std::fs::remove_file(&log_path);
    (status, output)
}

/// Runs `script` with `args` and fails the test, showing its output, unless it passed (or was skipped for
/// a missing toolchain outside CI). `what` names the suite in messages.
pub fn run_suite(what: &str, script: &str, args: &[&str]) {
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let required = std::env::var("EXISTENCE_GATE_REQUIRE_INTEROP").is_ok_and(|v| v == "1");
    let started = Instant::now();
    let (status, output) = run_script(script, args);
    let elapsed = started.elapsed().as_secs_f64();
    // Shown by the harness when the test fails (or with --nocapture).
    println!("{output}");
    let missing = || {
        panic!("{what}: toolchain missing and EXISTENCE_GATE_REQUIRE_INTEROP=1 (install with .ci/install-interop)")
    };
    match status.and_then(|s| s.code()) {
        Some(0) => announce(&format!("{what}: PASS in {elapsed:.1} s")),
        Some(SKIPPED) if !required => {
            // The script's line: "SKIPPED: ... toolchain missing (install with .ci/install-interop): what"
            let line = output
                .lines()
                .find(|line| line.starts_with("SKIPPED:"))
                .map(str::to_string)
                .unwrap_or_else(|| {
                    format!("SKIPPED: {what}: toolchain missing (install with .ci/install-interop)")
                });
            let rule = "=".repeat(100);
            announce(&format!(
                "{rule}\n{line}\n(set EXISTENCE_GATE_REQUIRE_INTEROP=1 to make this a failure)\n{rule}"
            ));
        }
        Some(SKIPPED) => missing(),
        Some(_) if required && output.contains("toolchain missing") => missing(),
        Some(code) => {
            panic!("{what} failed ({script} exited {code}) after {elapsed:.1} s; output above")
        }
        None if status.is_none() => {
            panic!("{what} did not finish within {BUDGET:?}; output above")
        }
        None => panic!("{what}: {script} was killed by a signal ({status:?}); output above"),
    }
}
