//! Requests as Redis clients send them: an array of bulk strings (`*2\r\n$8\r\nBF.EXISTS\r\n...`), or an
//! inline command (`PING\r\n`, what a person types into telnet).
//!
//! Written here rather than taken from a RESP crate because a server reads only this one shape, and reading
//! only it is both safer and cheaper:
//! - Redis's own server accepts nothing else in a request (`Protocol error: expected '$', got ':'`); a general
//!   RESP decoder also accepts nested arrays and parses them recursively: `redis-protocol` 6 aborts the
//!   process with a stack overflow on `*1\r\n` repeated 100,000 times (400 KB).
//! - Each header is checked against its limit the moment it is read, so a peer that announces a 2 GB bulk
//!   string or a billion arguments is refused before a byte of it is buffered.
//! - No frame tree: the arguments are slices of the read buffer. 2.4× faster than `redis-protocol` 6 on 16
//!   pipelined `BF.EXISTS`, 1.7× on a 100-key `BF.MEXISTS` (`cargo bench -p existence-gate-service --bench
//!   resp_request`; docs/resp.md).
//!
//! A request that is not complete yet is `Ok(None)`: the caller reads more and calls again with the same
//! [`Partial`], which resumes where the last call stopped, so a request arriving in many small reads is
//! scanned once. (Scanned again from its start on every read, a 60 KB request sent one byte at a time cost
//! 0.84 s of CPU: quadratic in its size.)

use bytes::{Bytes, BytesMut};

/// The largest request parts a peer may send; past them the request is refused with a protocol error and
/// the connection closed, as Redis does, so memory stays bounded whatever the peer sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Arguments in one command, its name included.
    pub max_args: usize,
    /// Bytes of one argument.
    pub max_arg_bytes: usize,
    /// Bytes of an inline command's line.
    pub max_inline_bytes: usize,
    /// Limits for a connection that has not authenticated yet (its refusals say so, as Redis's do).
    pub unauthenticated: bool,
}

impl RequestLimits {
    /// What a connection may send before `AUTH` where tokens are configured: Redis's own limits for an
    /// unauthenticated client (10 arguments, 16 KiB a bulk), or these limits if lower. Without them, one
    /// connection that never authenticated could hold an unfinished request of 10,016 arguments of 4 KiB
    /// (41 MB), and 50 of them exhausted a 3 GB address space: the abort took the gRPC port with it.
    pub fn before_auth(&self) -> Self {
        Self {
            max_args: self.max_args.min(10),
            max_arg_bytes: self.max_arg_bytes.min(16 * 1024),
            max_inline_bytes: self.max_inline_bytes.min(16 * 1024),
            unauthenticated: true,
        }
    }

    /// The words of a refusal of `what` past its limit, written only if a refusal is: formatting them for
    /// every header read was 4% of the server's CPU under pipelined `BF.ADD`s (`perf`).
    fn refused(&self, what: &'static str) -> Refused {
        Refused {
            unauthenticated: self.unauthenticated,
            what,
        }
    }
}

/// What a header past its limit is refused as: "invalid bulk length", "unauthenticated multibulk length".
#[derive(Debug, Clone, Copy)]
struct Refused {
    unauthenticated: bool,
    what: &'static str,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = if self.unauthenticated {
            "unauthenticated"
        } else {
            "invalid"
        };
        write!(f, "{state} {}", self.what)
    }
}

/// A request that cannot be read: answered with `-ERR Protocol error: ...`, then the connection is closed
/// (where the next request starts is unknown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

/// A command found at the front of the input: its arguments' byte ranges and its length; `None` while
/// incomplete.
type Scanned = Option<(Vec<(usize, usize)>, usize)>;

/// How far the request at the front of a connection's input has been read, between reads. Offsets are
/// from the front of the input, which only grows at its end until the request is taken.
#[derive(Debug, Default)]
pub struct Partial {
    /// An array's announced number of arguments, once its header was read.
    count: Option<usize>,
    /// The arguments read whole so far.
    ranges: Vec<(usize, usize)>,
    /// Where reading resumes: the next argument's header (an array), or the first byte not yet searched
    /// for the line's end (an inline command).
    at: usize,
}

/// Reads one command from the front of `buffer` and removes it: its arguments (the name first), `None` if
/// the buffer does not hold a whole command yet, or why it cannot be read. Each call reads from the start
/// (see [`take_command_resuming`] for a connection's reads).
pub fn take_command(
    buffer: &mut BytesMut,
    limits: &RequestLimits,
) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    take_command_resuming(buffer, limits, &mut Partial::default())
}

/// [`take_command`], resuming from `partial`, where the previous call on this buffer stopped; `partial` is
/// left ready for the next request when a command is taken.
pub fn take_command_resuming(
    buffer: &mut BytesMut,
    limits: &RequestLimits,
    partial: &mut Partial,
) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    let Some((ranges, length)) = scan(buffer, limits, partial)? else {
        return Ok(None);
    };
    *partial = Partial::default();
    let request = buffer.split_to(length).freeze();
    Ok(Some(
        ranges
            .into_iter()
            .map(|(start, end)| request.slice(start..end))
            .collect(),
    ))
}

/// The argument ranges of the command at the front of `input` and its length in bytes.
fn scan(
    input: &[u8],
    limits: &RequestLimits,
    partial: &mut Partial,
) -> Result<Scanned, ProtocolError> {
    match input.first() {
        None => Ok(None),
        Some(b'*') => scan_array(input, limits, partial),
        Some(_) => scan_inline(input, limits, partial),
    }
}

/// `*<count>\r\n` then `count` bulk strings `$<length>\r\n<bytes>\r\n`.
fn scan_array(
    input: &[u8],
    limits: &RequestLimits,
    partial: &mut Partial,
) -> Result<Scanned, ProtocolError> {
    let count = match partial.count {
        Some(count) => count,
        None => {
            let what = limits.refused("multibulk length");
            let Some((count, at)) = header(input, 0, limits.max_args, what)? else {
                return Ok(None);
            };
            if count == 0 {
                // Redis reads `*0\r\n` (and `*-1\r\n`) as nothing at all.
                return Ok(Some((Vec::new(), at)));
            }
            *partial = Partial {
                count: Some(count),
                ranges: Vec::with_capacity(count),
                at,
            };
            count
        }
    };
    while partial.ranges.len() < count {
        let at = partial.at;
        match input.get(at) {
            None => return Ok(None),
            Some(b'$') => {}
            Some(&other) => {
                return Err(ProtocolError(format!(
                    "Protocol error: expected '$', got '{}'",
                    char::from(other).escape_default()
                )))
            }
        }
        let what = limits.refused("bulk length");
        let Some((length, body)) = header(input, at, limits.max_arg_bytes, what)? else {
            return Ok(None);
        };
        let end = body + length;
        if input.len() < end + 2 {
            return Ok(None);
        }
        if &input[end..end + 2] != b"\r\n" {
            return Err(ProtocolError(
                "Protocol error: a bulk string is not followed by CRLF where its length ends"
                    .to_string(),
            ));
        }
        partial.ranges.push((body, end));
        partial.at = end + 2;
    }
    Ok(Some((std::mem::take(&mut partial.ranges), partial.at)))
}

/// The number in the header line at `at` (`*12\r\n`, `$5\r\n`) and where the line ends; `None` if the line
/// is not complete. A negative number reads as 0 (Redis's null array or bulk).
fn header(
    input: &[u8],
    at: usize,
    limit: usize,
    what: Refused,
) -> Result<Option<(usize, usize)>, ProtocolError> {
    // The longest header a limit allows: the type byte, 20 digits, CRLF.
    const LONGEST: usize = 23;
    let line = &input[at + 1..input.len().min(at + LONGEST)];
    let Some(end) = line.iter().position(|&b| b == b'\r') else {
        if line.len() + 1 >= LONGEST - 1 {
            return Err(ProtocolError(format!("Protocol error: {what}")));
        }
        return Ok(None);
    };
    let Some(&next) = input.get(at + 1 + end + 1) else {
        return Ok(None);
    };
    let digits = &line[..end];
    let invalid = || ProtocolError(format!("Protocol error: {what}"));
    if next != b'\n' {
        return Err(invalid());
    }
    let value: i64 = std::str::from_utf8(digits)
        .ok()
        .and_then(|d| d.parse().ok())
        .ok_or_else(invalid)?;
    if value > limit as i64 {
        return Err(ProtocolError(format!(
            "Protocol error: {what} {value}: the limit is {limit}"
        )));
    }
    Ok(Some((value.max(0) as usize, at + 1 + end + 2)))
}

/// A line of words separated by spaces or tabs, ended by LF (CRLF too).
fn scan_inline(
    input: &[u8],
    limits: &RequestLimits,
    partial: &mut Partial,
) -> Result<Scanned, ProtocolError> {
    let window = &input[..input.len().min(limits.max_inline_bytes + 1)];
    let searched = partial.at.min(window.len());
    let Some(newline) = window[searched..]
        .iter()
        .position(|&b| b == b'\n')
        .map(|offset| searched + offset)
    else {
        if window.len() > limits.max_inline_bytes {
            return Err(ProtocolError(format!(
                "Protocol error: too big inline request (the limit is {} bytes)",
                limits.max_inline_bytes
            )));
        }
        partial.at = window.len();
        return Ok(None);
    };
    let line_end = if newline > 0 && input[newline - 1] == b'\r' {
        newline - 1
    } else {
        newline
    };
    let mut ranges = Vec::new();
    let mut start = None;
    for (i, &b) in input[..line_end].iter().enumerate() {
        match (b == b' ' || b == b'\t', start) {
            (false, None) => start = Some(i),
            (true, Some(s)) => {
                ranges.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        ranges.push((s, line_end));
    }
    if let Some((start, end)) = ranges.iter().find(|(s, e)| e - s > limits.max_arg_bytes) {
        return Err(ProtocolError(format!(
            "Protocol error: an inline argument of {} bytes: the limit is {}",
            end - start,
            limits.max_arg_bytes
        )));
    }
    if ranges.len() > limits.max_args {
        return Err(ProtocolError(format!(
            "Protocol error: an inline request of {} arguments: the limit is {}",
            ranges.len(),
            limits.max_args
        )));
    }
    Ok(Some((ranges, newline + 1)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIMITS: RequestLimits = RequestLimits {
        max_args: 8,
        max_arg_bytes: 64,
        max_inline_bytes: 128,
        unauthenticated: false,
    };

    fn take(input: &[u8]) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        take_command(&mut BytesMut::from(input), &LIMITS)
    }

    fn encode(args: &[Vec<u8>]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            out.extend_from_slice(arg);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    #[test]
    fn a_request_array_and_an_inline_command_read_alike() {
        let expected = vec![
            Bytes::from("BF.EXISTS"),
            Bytes::from("users"),
            Bytes::from("a b"),
        ];
        assert_eq!(
            take(b"*3\r\n$9\r\nBF.EXISTS\r\n$5\r\nusers\r\n$3\r\na b\r\n").unwrap(),
            Some(expected)
        );
        assert_eq!(
            take(b"  PING \t hello\r\n").unwrap(),
            Some(vec![Bytes::from("PING"), Bytes::from("hello")])
        );
        assert_eq!(take(b"PING\n").unwrap(), Some(vec![Bytes::from("PING")]));
    }

    #[test]
    fn two_pipelined_commands_are_taken_one_at_a_time() {
        let mut buffer =
            BytesMut::from(&b"*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nECHO\r\n$1\r\nx\r\n"[..]);
        assert_eq!(
            take_command(&mut buffer, &LIMITS).unwrap().unwrap().len(),
            1
        );
        assert_eq!(
            take_command(&mut buffer, &LIMITS).unwrap().unwrap().len(),
            2
        );
        assert!(buffer.is_empty());
        assert_eq!(take_command(&mut buffer, &LIMITS).unwrap(), None);
    }

    #[test]
    fn limits_are_checked_on_the_header_before_the_body_arrives() {
        let error = take(b"*1\r\n$2000000000\r\n").unwrap_err();
        assert_eq!(
            error.0,
            "Protocol error: invalid bulk length 2000000000: the limit is 64"
        );
        let error = take(b"*1000000\r\n").unwrap_err();
        assert_eq!(
            error.0,
            "Protocol error: invalid multibulk length 1000000: the limit is 8"
        );
        let error = take(&[b'x'; 200]).unwrap_err();
        assert!(error.0.contains("too big inline request"), "{error:?}");
        let error = take(format!("PING {}\r\n", "x".repeat(65)).as_bytes()).unwrap_err();
        assert!(
            error
                .0
                .contains("inline argument of 65 bytes: the limit is 64"),
            "{error:?}"
        );
        assert!(take(b"*99999999999999999999999999\r\n").is_err());
    }

    #[test]
    fn nested_arrays_are_refused_not_recursed_into() {
        let nested = b"*1\r\n".repeat(1_000);
        assert_eq!(
            take(&nested).unwrap_err().0,
            "Protocol error: expected '$', got '*'"
        );
    }

    #[test]
    fn malformed_headers_and_terminators_are_errors() {
        assert!(take(b"*1\r\n$3\r\nabcXY").is_err());
        assert!(take(b"*x\r\n").is_err());
        assert!(take(b"*1\rx").is_err());
        assert_eq!(take(b"*0\r\n").unwrap(), Some(vec![]));
    }

    proptest! {
        /// Every command within the limits reads back as it was written, whatever prefix of it arrived
        /// first: a prefix is incomplete, never an error or another command.
        #[test]
        fn commands_round_trip_and_prefixes_are_incomplete(
            args in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 1..8),
        ) {
            let encoded = encode(&args);
            for cut in 0..encoded.len() {
                prop_assert_eq!(take(&encoded[..cut]).unwrap(), None);
            }
            let read = take(&encoded).unwrap().unwrap();
            prop_assert_eq!(read.iter().map(|a| a.to_vec()).collect::<Vec<_>>(), args);
        }

        /// Commands arriving in pieces of any sizes, read by one connection resuming where it stopped, read
        /// as they do arriving whole, in order, and leave nothing behind.
        #[test]
        fn commands_read_in_pieces_resuming_read_as_whole(
            commands in prop::collection::vec(
                prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 1..8),
                1..4,
            ),
            inline in any::<bool>(),
            cuts in prop::collection::vec(1usize..40, 1..64),
        ) {
            let mut wire = Vec::new();
            for args in &commands {
                wire.extend(encode(args));
            }
            if inline {
                wire.extend_from_slice(b"PING  hello\r\n");
            }
            let (mut buffer, mut partial, mut read, mut sent) =
                (BytesMut::new(), Partial::default(), Vec::new(), 0);
            for cut in cuts.iter().cycle() {
                if sent == wire.len() {
                    break;
                }
                let next = (sent + cut).min(wire.len());
                buffer.extend_from_slice(&wire[sent..next]);
                sent = next;
                while let Some(command) = take_command_resuming(&mut buffer, &LIMITS, &mut partial).unwrap() {
                    read.push(command.iter().map(|a| a.to_vec()).collect::<Vec<_>>());
                }
            }
            let mut expected = commands.clone();
            if inline {
                expected.push(vec![b"PING".to_vec(), b"hello".to_vec()]);
            }
            prop_assert_eq!(read, expected);
            prop_assert!(buffer.is_empty());
        }

        /// Any bytes at all: an answer (a command, incomplete, or an error), never a panic, and a command
        /// never longer than what arrived.
        #[test]
        fn arbitrary_bytes_never_panic(input in prop::collection::vec(any::<u8>(), 0..256)) {
            let mut buffer = BytesMut::from(&input[..]);
            if let Ok(Some(_)) = take_command(&mut buffer, &LIMITS) {
                prop_assert!(buffer.len() < input.len());
            }
        }
    }
}
