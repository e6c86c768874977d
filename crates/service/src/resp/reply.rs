//! Replies, and the refusals commands answer with, written straight into the connection's output buffer in the protocol the client chose with
//! `HELLO`: RESP2 (every client's default) or RESP3, which adds maps, nulls, doubles and pushes. Each
//! RESP3-only type has the RESP2 form Redis itself sends (a map as a flat array of keys and values, a push
//! as an array), so one handler serves both.

use bytes::{BufMut, BytesMut};

/// The protocol version of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Resp2,
    Resp3,
}

/// Why a command was refused: Redis's error prefix and the message.
#[derive(Debug)]
pub struct Refusal {
    pub kind: &'static str,
    pub message: String,
}

impl Refusal {
    pub fn err(message: impl Into<String>) -> Self {
        Self {
            kind: "ERR",
            message: message.into(),
        }
    }

    /// An error with no prefix, as RedisBloom answers some (`-Bad capacity`): a client sees the text alone.
    pub fn bare(message: impl Into<String>) -> Self {
        Self {
            kind: "",
            message: message.into(),
        }
    }
}

pub type Outcome = Result<(), Refusal>;

/// Writes replies into `out` in `protocol`.
#[derive(Debug)]
pub struct Replies<'a> {
    pub out: &'a mut BytesMut,
    pub protocol: Protocol,
}

impl Replies<'_> {
    /// `+OK`-style status.
    pub fn simple(&mut self, status: &str) {
        self.line(b'+', status.as_bytes());
    }

    /// An error: `kind` is Redis's prefix (`ERR`, `WRONGPASS`, `NOAUTH`, `NOPERM`, ...; empty for none).
    /// Line breaks in the message would end the reply early, so they become spaces.
    pub fn error(&mut self, kind: &str, message: &str) {
        self.out.reserve(kind.len() + message.len() + 4);
        self.out.put_u8(b'-');
        if !kind.is_empty() {
            self.out.put_slice(kind.as_bytes());
            self.out.put_u8(b' ');
        }
        for &b in message.as_bytes() {
            self.out
                .put_u8(if b == b'\r' || b == b'\n' { b' ' } else { b });
        }
        self.out.put_slice(b"\r\n");
    }

    pub fn integer(&mut self, value: i64) {
        self.number(b':', value);
    }

    /// A boolean: `#t`/`#f` in RESP3 (what RedisBloom answers there), `:1`/`:0` in RESP2.
    pub fn boolean(&mut self, value: bool) {
        match self.protocol {
            Protocol::Resp3 => self
                .out
                .put_slice(if value { b"#t\r\n" } else { b"#f\r\n" }),
            Protocol::Resp2 => self.integer(i64::from(value)),
        }
    }

    pub fn bulk(&mut self, value: &[u8]) {
        self.number(b'$', value.len() as i64);
        self.out.put_slice(value);
        self.out.put_slice(b"\r\n");
    }

    /// The null reply: `_` in RESP3, the null bulk string in RESP2.
    pub fn null(&mut self) {
        match self.protocol {
            Protocol::Resp3 => self.out.put_slice(b"_\r\n"),
            Protocol::Resp2 => self.out.put_slice(b"$-1\r\n"),
        }
    }

    /// A double: `,` in RESP3, a bulk string of its decimal form in RESP2.
    pub fn double(&mut self, value: f64) {
        let text = value.to_string();
        match self.protocol {
            Protocol::Resp3 => self.line(b',', text.as_bytes()),
            Protocol::Resp2 => self.bulk(text.as_bytes()),
        }
    }

    /// The header of an array of `length` replies, which follow.
    pub fn array(&mut self, length: usize) {
        self.number(b'*', length as i64);
    }

    /// The header of a map of `pairs` key-value pairs (each key then its value follows): a flat array of
    /// `2 × pairs` in RESP2.
    pub fn map(&mut self, pairs: usize) {
        match self.protocol {
            Protocol::Resp3 => self.number(b'%', pairs as i64),
            Protocol::Resp2 => self.array(2 * pairs),
        }
    }

    /// The header of an out-of-band push of `length` items (Pub/Sub messages): an array in RESP2.
    pub fn push(&mut self, length: usize) {
        match self.protocol {
            Protocol::Resp3 => self.number(b'>', length as i64),
            Protocol::Resp2 => self.array(length),
        }
    }

    /// The header of a set of `length` members: an array in RESP2.
    pub fn set(&mut self, length: usize) {
        match self.protocol {
            Protocol::Resp3 => self.number(b'~', length as i64),
            Protocol::Resp2 => self.array(length),
        }
    }

    fn line(&mut self, kind: u8, text: &[u8]) {
        self.out.reserve(text.len() + 3);
        self.out.put_u8(kind);
        self.out.put_slice(text);
        self.out.put_slice(b"\r\n");
    }

    fn number(&mut self, kind: u8, value: i64) {
        let mut digits = itoa::Buffer::new();
        self.line(kind, digits.format(value).as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(protocol: Protocol, write: impl FnOnce(&mut Replies<'_>)) -> String {
        let mut out = BytesMut::new();
        write(&mut Replies {
            out: &mut out,
            protocol,
        });
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn resp3_types_fall_back_to_their_resp2_forms() {
        let map = |r: &mut Replies<'_>| {
            r.map(1);
            r.bulk(b"proto");
            r.integer(3);
            r.null();
            r.double(0.5);
            r.push(0);
            r.boolean(true);
        };
        assert_eq!(
            written(Protocol::Resp3, map),
            "%1\r\n$5\r\nproto\r\n:3\r\n_\r\n,0.5\r\n>0\r\n#t\r\n"
        );
        assert_eq!(
            written(Protocol::Resp2, map),
            "*2\r\n$5\r\nproto\r\n:3\r\n$-1\r\n$3\r\n0.5\r\n*0\r\n:1\r\n"
        );
    }

    #[test]
    fn an_error_message_cannot_break_the_reply_stream() {
        let text = written(Protocol::Resp2, |r| r.error("ERR", "two\r\nlines"));
        assert_eq!(text, "-ERR two  lines\r\n");
    }
}
