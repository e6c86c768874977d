//! A wall clock a test can step under a real process: libfaketime (Debian's `faketime`) preloaded, reading
//! its offset from a file on every call, with the monotonic clock left alone (as an operator's `date -s` or
//! an NTP step leaves it). `.ci/run` installs it and sets `EXISTENCE_GATE_REQUIRE_FAKETIME=1`, so in CI a
//! missing library fails the tests; elsewhere the tests that need it say so and skip.

use std::path::{Path, PathBuf};

/// Where Debian's `faketime` package puts the library.
const LIBRARY: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The offset file of processes started with [`apply`](Self::apply).
#[derive(Debug)]
pub struct SteppedClock {
    file: PathBuf,
}

impl SteppedClock {
    /// A clock at the true time whose offset lives in `dir`; `None` (with a note) when libfaketime is not
    /// installed and not required.
    pub fn new(dir: &Path) -> Option<Self> {
        if !Path::new(LIBRARY).is_file() {
            let required = std::env::var("EXISTENCE_GATE_REQUIRE_FAKETIME").is_ok_and(|v| v == "1");
            assert!(
                !required,
                "libfaketime is not installed (apt-get install -y faketime)"
            );
            eprintln!("libfaketime is not installed (apt-get install -y faketime): skipping");
            return None;
        }
        let clock = Self {
            file: dir.join("faketime"),
        };
        clock.set("+0");
        Some(clock)
    }

    /// Steps the wall clock of every process started with this clock to the true time plus `offset` (as
    /// libfaketime writes it: "+2h", "-30m", "+0").
    pub fn set(&self, offset: &str) {
        std::fs::write(&self.file, offset).expect("the faketime offset file");
    }

    /// Makes `command` run on this clock.
    pub fn apply(&self, command: &mut tokio::process::Command) {
        command
            .env("LD_PRELOAD", LIBRARY)
            .env("FAKETIME_TIMESTAMP_FILE", &self.file)
            .env("FAKETIME_NO_CACHE", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .env("FAKETIME_DONT_RESET", "1");
    }
}
