//! Where `load` and `rebuild` take their keys from: a file, standard input, or a PostgreSQL query. All three
//! yield the same batches, so the commands do not care which.

use std::path::{Path, PathBuf};

use clap::Args;

use crate::cli::progress::Total;
use crate::cli::reader::{Format, KeyReader};
use crate::client::postgres::{KeyFormat, QueryKeys};
use crate::client::Batch;

/// The key source flags of `load` and `rebuild`.
#[derive(Debug, Clone, Args)]
pub struct SourceArgs {
    /// A file of keys, or - for standard input (the default).
    #[arg(value_name = "FILE|-")]
    pub input: Option<PathBuf>,
    /// How the keys are written: lines (one per line), raw (each preceded by its length as a 4-byte u32
    /// big-endian) or hex (one hexadecimal key per line).
    #[arg(long, value_enum, default_value_t = Format::Lines)]
    pub format: Format,
    /// Read the keys from PostgreSQL instead of a file: a connection string such as
    /// postgres://USER:PASSWORD@HOST:PORT/DATABASE (no TLS).
    #[arg(
        long,
        value_name = "DSN",
        conflicts_with_all = ["input", "format"],
        requires = "query"
    )]
    pub postgres: Option<String>,
    /// With --postgres: the query whose first column, in its text form, is the key; e.g.
    /// "SELECT id::text FROM users". Rows are streamed (COPY), never held in memory; NULLs are skipped.
    #[arg(long, requires = "postgres")]
    pub query: Option<String>,
    /// With --postgres: how a value becomes a key. text: its text form, as psql prints it; hex: a bytea's
    /// bytes as lowercase hexadecimal; raw: a bytea's bytes themselves (what an application holding the
    /// bytes passes to MayExist).
    #[arg(long, value_enum, default_value_t = KeyFormat::Text, requires = "postgres")]
    pub key_format: KeyFormat,
}

/// An open key source.
pub enum Source {
    Reader(KeyReader),
    Query(QueryKeys),
}

impl Source {
    /// Opens the source `args` names, with what the progress bar can measure against.
    pub async fn open(args: &SourceArgs) -> Result<(Self, Option<Total>), String> {
        if let (Some(dsn), Some(query)) = (&args.postgres, &args.query) {
            let (keys, estimate) = QueryKeys::open(dsn, query, args.key_format).await?;
            return Ok((Source::Query(keys), estimate.map(Total::EstimatedKeys)));
        }
        match args.input.as_deref() {
            None => Ok((Source::Reader(stdin(args.format)?), None)),
            Some(path) if path == Path::new("-") => Ok((Source::Reader(stdin(args.format)?), None)),
            Some(path) => {
                let file = tokio::fs::File::open(path)
                    .await
                    .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
                let metadata = file
                    .metadata()
                    .await
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                // A pipe or device has no length to measure progress against.
                let total = metadata.is_file().then_some(Total::Bytes(metadata.len()));
                let reader =
                    KeyReader::new(Box::new(file), path.display().to_string(), args.format);
                Ok((Source::Reader(reader), total))
            }
        }
    }

    /// Up to `size` keys, or `None` once the source is exhausted.
    pub async fn next_batch(&mut self, size: usize) -> Result<Option<Batch>, String> {
        match self {
            Source::Reader(reader) => reader.next_batch(size).await,
            Source::Query(rows) => rows.next_batch(size).await,
        }
    }

    /// Inputs that held no key (empty lines, NULL or empty columns), for the summary.
    pub fn skipped(&self) -> u64 {
        match self {
            Source::Reader(reader) => reader.skipped,
            Source::Query(rows) => rows.skipped,
        }
    }
}

/// Standard input as keys in `format`; an error if it is `/dev/null`, which is also what a closed standard
/// input reads from (the runtime reopens it there), so a command started without its input says so
/// instead of reporting "0 keys" as a success.
pub fn stdin(format: Format) -> Result<KeyReader, String> {
    if is_dev_null(Path::new("/dev/stdin")) {
        return Err(
            "standard input is closed (or /dev/null): give a FILE, or pipe the keys in \
             (e.g. `psql -Atc 'SELECT id FROM users' | existence-gate load -n users`)"
                .to_string(),
        );
    }
    Ok(KeyReader::new(
        Box::new(tokio::io::stdin()),
        "standard input".into(),
        format,
    ))
}

/// Whether `path` leads to `/dev/null`.
fn is_dev_null(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(path), std::fs::metadata("/dev/null")) {
        (Ok(file), Ok(null)) => (file.dev(), file.ino()) == (null.dev(), null.ino()),
        _ => false,
    }
}
