//! The polyglot interop suite as cargo tests: for each of Java, Go, Python and Node, `tests/interop/run.sh`
//! starts the binary built by this `cargo test`, generates that language's stubs from `proto/`, and runs the
//! shared scenario client (`tests/interop/LANG/`) and the read-path example (`examples/LANG/`) against it,
//! besides the load-balancer checks (`existence-gate probe`, `/healthz`, `/readyz`, SIGTERM).
//!
//! A language whose toolchain is missing is SKIPPED with a loud message and passes, unless
//! `EXISTENCE_GATE_REQUIRE_INTEROP=1` (as in CI), where it fails. `.ci/install-interop` installs them all.

use std::fs::File;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::thread::sleep;
use std::time::{Duration, Instant};

/// The languages share two cores: one compiles and runs at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// run.sh bounds every step; this bounds a whole language run, whatever happens inside it.
const BUDGET: Duration = Duration::from_secs(900);

/// run.sh's status when nothing failed but a language was skipped.
const SKIPPED: i32 = 77;

/// Writes past the test harness's capture, so the line shows even when the test passes.
fn announce(text: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "{text}");
    let _ = stderr.flush();
}

/// Ends run.sh and everything it started (its own process group): TERM first, so it stops its server.
fn stop_group(pid: u32) {
    let group = format!("-{pid}");
    let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
    sleep(Duration::from_secs(10));
    let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
}

/// Runs `run.sh LANG` within the budget: its exit status (None on timeout) and its output.
fn run_suite(lang: &str) -> (Option<ExitStatus>, String) {
    // Resolved at run time: a binary reused from a shared target folder runs this checkout's suite.
    let root =
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    let script = format!("{root}/tests/interop/run.sh");
    let log_path = std::env::temp_dir().join(format!(
        "existence-gate-interop-{lang}-{}.log",
        std::process::id()
    ));
    let log = File::create(&log_path).expect("creates the log file");
    let mut child = Command::new("bash")
        .arg(&script)
        .arg(lang)
        .env("EXISTENCE_GATE_BIN", env!("CARGO_BIN_EXE_existence-gate"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clones the log handle"))
        .stderr(log)
        .process_group(0)
        .spawn()
        .expect("bash runs tests/interop/run.sh");
    let deadline = Instant::now() + BUDGET;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waits for run.sh") {
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

fn interop(lang: &str) {
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let required = std::env::var("EXISTENCE_GATE_REQUIRE_INTEROP").is_ok_and(|v| v == "1");
    let started = Instant::now();
    let (status, output) = run_suite(lang);
    let elapsed = started.elapsed().as_secs_f64();
    // Shown by the harness when the test fails (or with --nocapture).
    println!("{output}");
    match status.and_then(|s| s.code()) {
        Some(0) => announce(&format!("interop {lang}: PASS in {elapsed:.1} s")),
        Some(SKIPPED) if !required => {
            // run.sh's line: "SKIPPED: LANG toolchain missing (install with .ci/install-interop): what is missing"
            let line = output
                .lines()
                .find(|line| line.starts_with("SKIPPED:"))
                .map(str::to_string)
                .unwrap_or_else(|| {
                    format!("SKIPPED: {lang} toolchain missing (install with .ci/install-interop)")
                });
            let rule = "=".repeat(100);
            announce(&format!(
                "{rule}\n{line}\n(set EXISTENCE_GATE_REQUIRE_INTEROP=1 to make this a failure)\n{rule}"
            ));
        }
        Some(SKIPPED) => panic!(
            "{lang} toolchain missing and EXISTENCE_GATE_REQUIRE_INTEROP=1 (install with .ci/install-interop)"
        ),
        Some(_) if required && output.contains("toolchain missing") => panic!(
            "{lang} toolchain missing and EXISTENCE_GATE_REQUIRE_INTEROP=1 (install with .ci/install-interop)"
        ),
        Some(code) => {
            panic!("interop {lang} failed (run.sh exited {code}) after {elapsed:.1} s; output above")
        }
        None if status.is_none() => {
            panic!("interop {lang} did not finish within {BUDGET:?}; output above")
        }
        None => panic!("interop {lang}: run.sh was killed by a signal ({status:?}); output above"),
    }
}

#[test]
fn python_client_and_example() {
    interop("python");
}

#[test]
fn go_client_and_example() {
    interop("go");
}

#[test]
fn java_client_and_example() {
    interop("java");
}

#[test]
fn node_client_and_example() {
    interop("node");
}
