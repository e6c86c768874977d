//! Progress of a bulk command: a bar on stderr while it is a terminal (keys/s, and percent and ETA when the
//! size of the input is known), nothing while it is not — a log file should get the one summary line the
//! command prints at the end, not a redraw per batch.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{HumanCount, ProgressBar, ProgressStyle};

/// What the input's size is known as, if anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Total {
    /// A file's length: progress is the bytes whose keys the gate has acknowledged.
    Bytes(u64),
    /// The planner's estimate of a query's rows: progress is keys acknowledged (it may overshoot).
    EstimatedKeys(u64),
}

/// A running bulk command's progress.
pub struct Progress {
    bar: ProgressBar,
    total: Option<Total>,
    started: Instant,
    keys: u64,
}

/// How a bulk command went.
#[derive(Debug, Clone, Copy)]
pub struct Finished {
    pub keys: u64,
    pub elapsed: Duration,
}

impl Finished {
    /// Keys per second over the whole command.
    pub fn keys_per_second(&self) -> u64 {
        (self.keys as f64 / self.elapsed.as_secs_f64().max(1e-9)) as u64
    }

    /// `N keys in S s (R keys/s)`, the figures every summary line carries.
    pub fn figures(&self) -> String {
        format!(
            "{} in {:.2} s ({} keys/s)",
            crate::cli::output::count(self.keys, "key"),
            self.elapsed.as_secs_f64(),
            HumanCount(self.keys_per_second())
        )
    }
}

impl Progress {
    /// Starts measuring now; draws a bar only when stderr is a terminal.
    pub fn start(total: Option<Total>) -> Self {
        let bar = if std::io::stderr().is_terminal() {
            let (bar, template) = match total {
                Some(Total::Bytes(bytes)) => (
                    ProgressBar::new(bytes),
                    "{bar:30} {percent:>3}% {msg}, ETA {eta}",
                ),
                Some(Total::EstimatedKeys(rows)) => (
                    ProgressBar::new(rows),
                    "{bar:30} {percent:>3}% of ~{human_len} rows: {msg}, ETA {eta}",
                ),
                None => (ProgressBar::no_length(), "{spinner} {msg}, {elapsed}"),
            };
            let style = ProgressStyle::with_template(template)
                .expect("the templates are valid")
                .progress_chars("=> ");
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        } else {
            ProgressBar::hidden()
        };
        Self {
            bar,
            total,
            started: Instant::now(),
            keys: 0,
        }
    }

    /// `keys` more keys, read from `input_bytes` bytes of input, are done.
    pub fn advance(&mut self, keys: u64, input_bytes: u64) {
        self.keys += keys;
        match self.total {
            Some(Total::Bytes(_)) => self.bar.inc(input_bytes),
            Some(Total::EstimatedKeys(_)) => {
                self.bar.inc(keys);
                if self.bar.position() > self.bar.length().unwrap_or(0) {
                    self.bar.set_length(self.bar.position());
                }
            }
            None => self.bar.inc(keys),
        }
        if !self.bar.is_hidden() {
            let so_far = Finished {
                keys: self.keys,
                elapsed: self.started.elapsed(),
            };
            self.bar.set_message(format!(
                "{} keys, {} keys/s",
                HumanCount(so_far.keys),
                HumanCount(so_far.keys_per_second())
            ));
        }
    }

    /// Clears the bar and returns the totals.
    pub fn finish(self) -> Finished {
        self.bar.finish_and_clear();
        Finished {
            keys: self.keys,
            elapsed: self.started.elapsed(),
        }
    }
}
