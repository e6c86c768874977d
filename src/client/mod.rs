//! What the command-line tools ([`crate::cli`]) and the change feed ([`crate::feed`]) share as clients of a
//! running gate, so that neither reaches into the other:
//!
//! - [`connection`]: `--addr`, `--token`, TLS: one channel to the gate, the token on every call.
//! - [`failure`]: refused calls and unreachable gates as one-line reasons naming what to fix.
//! - [`postgres`]: connecting to PostgreSQL, and keys from a query streamed with `COPY (query) TO STDOUT`.

pub mod connection;
pub mod failure;
pub mod postgres;

use bytes::Bytes;

/// Keys cut from an input (a file, standard input or a query), and how many input bytes they took.
#[derive(Debug)]
pub struct Batch {
    pub keys: Vec<Bytes>,
    pub input_bytes: u64,
}
