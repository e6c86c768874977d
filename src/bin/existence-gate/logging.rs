//! Where log lines go: a server's to stdout (its output is its log), every other command's to stderr, so
//! stdout stays for the data a script reads.

use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber: `RUST_LOG` if set, else `info` for a server and `warn` for the rest.
pub(crate) fn init(serving: bool) {
    let (writer, ansi) = if serving {
        (
            BoxMakeWriter::new(std::io::stdout),
            std::io::IsTerminal::is_terminal(&std::io::stdout()),
        )
    } else {
        (
            BoxMakeWriter::new(std::io::stderr),
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
        )
    };
    let default_level = if serving { "info" } else { "warn" };
    tracing_subscriber::fmt()
        .with_writer(writer)
        .with_ansi(ansi)
        // A closed stdout (a log collector that died) must not turn every log line into a panic: by
        // default the subscriber reports its own write failures with eprintln!, which panics when stderr
        // is gone too, killing the task that logged (the signal handler, the accept loop).
        .log_internal_errors(false)
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level)),
        )
        .init();
}
