//! The `resp_session` target: a whole RESP connection — `AUTH`, pipelines, Pub/Sub, protocol switches and
//! junk, interleaved and sent in arbitrary pieces — served by the port's own connection loop
//! ([`serve_io`]) over an in-memory stream, on a gate with tokens and a small request budget.
//!
//! The input is a program ([`Program::decode`]): each byte picks a step (a command, a run of pipelined
//! lookups, raw bytes) and the bytes after it its arguments, and a step with the top bit set ends the piece
//! written so far, so that requests are split where a fuzzer chooses. The request reader alone is the
//! `resp_request` target; this one reaches what a connection does with what it read.
//!
//! Checked of every session: the connection's task ends (the client closed its side, or the server closed
//! it) without a panic; what the server wrote is a sequence of whole RESP values; and the connection gave
//! back every byte of the port's request budget it held.

use std::sync::Arc;
use std::time::Duration;

use existence_gate::core::writes::Writes;
use existence_gate::service::access::Access;
use existence_gate::service::auth::Authorizer;
use existence_gate::service::resp::{serve_io, Port, RespOptions};
use existence_gate::service::shutdown::Shutdown;
use existence_gate::service::writes::LocalWrites;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::shared::{new_gate, parsed, CONFIG};

/// The plaintexts of the tokens of [`CONFIG`].
const READER: &str = "reader-token";
const WRITER: &str = "writer-token";

/// The steps a program is made of, one byte each (its low bits pick it).
const STEPS: u8 = 14;

/// A session's bytes, cut into the pieces they are written in.
#[derive(Debug, Default)]
pub struct Program {
    pub pieces: Vec<Vec<u8>>,
}

impl Program {
    /// The program `data` spells (see the module doc).
    pub fn decode(data: &[u8]) -> Self {
        let mut program = Self::default();
        let mut piece = Vec::new();
        let mut bytes = data.iter().copied();
        while let Some(step) = bytes.next() {
            let mut arg = || bytes.next().unwrap_or(0);
            let key = format!("k{}", arg() % 8);
            let command: Vec<String> = match (step & 0x7f) % STEPS {
                0 => vec!["AUTH".into(), READER.into()],
                1 => vec!["AUTH".into(), WRITER.into()],
                2 => vec!["AUTH".into(), "writer".into(), "not-a-token".into()],
                3 => vec!["BF.ADD".into(), "users".into(), key],
                4 => vec!["BF.MADD".into(), "default".into(), key.clone(), key],
                5 => {
                    // A run of lookups, as a pipelining client sends them: one piece of bytes.
                    let run = 1 + arg() % 6;
                    for i in 0..run {
                        let item = if i == 2 {
                            String::new()
                        } else {
                            format!("k{i}")
                        };
                        piece.extend(encode(&["BF.EXISTS", "users", &item]));
                    }
                    continue;
                }
                6 => {
                    let seq = arg();
                    let channel = match seq % 3 {
                        0 => "invalidations:users".to_string(),
                        1 => format!("invalidations:users@{seq}"),
                        _ => "invalidations:nowhere".to_string(),
                    };
                    vec!["SUBSCRIBE".into(), channel]
                }
                7 => vec!["UNSUBSCRIBE".into()],
                8 => vec![
                    "HELLO".into(),
                    "3".into(),
                    "AUTH".into(),
                    "writer".into(),
                    WRITER.into(),
                ],
                9 => vec!["PING".into()],
                10 => vec!["RESET".into()],
                11 => vec!["BF.INSERT".into(), "users".into(), "ITEMS".into(), key],
                12 => {
                    // Raw bytes: junk, a torn header, an inline command.
                    let length = usize::from(arg() % 24);
                    piece.extend((0..length).map(|_| arg()));
                    continue;
                }
                _ => vec!["INFO".into()],
            };
            let command: Vec<&str> = command.iter().map(String::as_str).collect();
            piece.extend(encode(&command));
            if step & 0x80 != 0 {
                program.pieces.push(std::mem::take(&mut piece));
            }
        }
        program.pieces.push(piece);
        program
    }
}

/// `args` as a RESP array of bulk strings.
fn encode(args: &[&str]) -> Vec<u8> {
    let mut bytes = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        bytes.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
    bytes
}

/// Runs the session `data` spells against a fresh port, and checks it (see the module doc).
pub fn resp_session(data: &[u8]) {
    let program = Program::decode(data);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let (gate, _clock) = new_gate(CONFIG);
        let gate = Arc::new(gate);
        let authorizer =
            Authorizer::new(&parsed(CONFIG).tokens).expect("the checks' tokens are valid");
        let access = Access::new(authorizer, Shutdown::default(), 2);
        let writes: Arc<dyn Writes> = Arc::new(LocalWrites::new(Arc::clone(&gate)));
        let mut options = RespOptions::new(([127, 0, 0, 1], 0).into());
        options.request_memory = 64 * 1024;
        let port = Port::new(gate, writes, access, options);
        let (client, server) = tokio::io::duplex(4096);
        let serving = Arc::clone(&port);
        let served = tokio::spawn(async move {
            serve_io(&serving, server, Duration::from_secs(5)).await;
        });
        let (mut from_server, mut to_server) = tokio::io::split(client);
        let read = tokio::spawn(async move {
            let mut output = Vec::new();
            let _ = from_server.read_to_end(&mut output).await;
            output
        });
        for piece in &program.pieces {
            if to_server.write_all(piece).await.is_err() {
                break; // the server closed the connection
            }
            tokio::task::yield_now().await;
        }
        let _ = to_server.shutdown().await;
        drop(to_server);
        served.await.expect("the connection's task panicked");
        let output = read.await.expect("the reader");
        let mut rest = &output[..];
        while !rest.is_empty() {
            rest = value(rest).unwrap_or_else(|| {
                panic!(
                    "the server wrote something that is not a RESP value at byte {} of {:?}",
                    output.len() - rest.len(),
                    String::from_utf8_lossy(&output)
                )
            });
        }
        assert_eq!(
            port.request_memory_held(),
            0,
            "a closed connection holds budget"
        );
    });
}

/// The bytes after the RESP value at the start of `bytes`, if one is there whole.
fn value(bytes: &[u8]) -> Option<&[u8]> {
    let (&kind, rest) = bytes.split_first()?;
    let end = rest.windows(2).position(|w| w == b"\r\n")?;
    let (line, rest) = (&rest[..end], &rest[end + 2..]);
    let number = || std::str::from_utf8(line).ok()?.parse::<i64>().ok();
    match kind {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Some(rest),
        b'$' | b'=' | b'!' => match number()? {
            -1 => Some(rest),
            length => {
                let length = usize::try_from(length).ok()?;
                (rest.get(length..length + 2)? == b"\r\n").then(|| &rest[length + 2..])
            }
        },
        b'*' | b'~' | b'>' | b'%' => {
            let count = number()?;
            if count < 0 {
                return Some(rest);
            }
            let items = if kind == b'%' { count * 2 } else { count };
            (0..items).try_fold(rest, |rest, _| value(rest))
        }
        _ => None,
    }
}
