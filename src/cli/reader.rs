//! Keys from a byte stream (a file or standard input) in one of three formats, cut into batches without
//! copying: each key is a slice of the chunk it was read into.

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::client::Batch;
use crate::core::config::MAX_KEY_BYTES_LIMIT;

/// How much is read at a time: large enough that a read costs little per key.
const CHUNK: usize = 1 << 20;
/// Bytes a line may hold besides its key: the line end, and spaces around a hexadecimal key.
const LINE_SLACK: usize = 64;

/// How keys are written in the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One key per line, taken byte for byte (a trailing \r is dropped); empty lines are skipped.
    Lines,
    /// Binary keys, each preceded by its length as a 4-byte unsigned big-endian integer (u32 BE).
    Raw,
    /// One key per line in hexadecimal (surrounding spaces ignored); empty lines are skipped.
    Hex,
}

/// Reads keys in `format` from `input`.
pub struct KeyReader {
    input: Box<dyn AsyncRead + Unpin + Send>,
    /// What the input is, for errors: a path or "standard input".
    name: String,
    format: Format,
    buf: BytesMut,
    eof: bool,
    /// Lines (or raw records) consumed so far: the number of the one being cut, in errors.
    records: u64,
    /// Empty keys skipped: the gate refuses them, and an empty line is no key.
    pub skipped: u64,
}

impl KeyReader {
    /// A reader of `input` (called `name` in errors).
    pub fn new(input: Box<dyn AsyncRead + Unpin + Send>, name: String, format: Format) -> Self {
        Self {
            input,
            name,
            format,
            buf: BytesMut::new(),
            eof: false,
            records: 0,
            skipped: 0,
        }
    }

    /// Up to `size` keys, or `None` once the input is exhausted.
    pub async fn next_batch(&mut self, size: usize) -> Result<Option<Batch>, String> {
        let mut keys = Vec::with_capacity(size);
        let mut input_bytes = 0;
        loop {
            while keys.len() < size {
                let Some((key, used)) = self.cut()? else {
                    break;
                };
                input_bytes += used;
                if key.is_empty() {
                    self.skipped += 1;
                } else {
                    keys.push(key);
                }
            }
            if keys.len() == size || self.eof {
                break;
            }
            self.fill().await?;
        }
        Ok((!keys.is_empty()).then_some(Batch { keys, input_bytes }))
    }

    /// Reads the next chunk into the buffer.
    async fn fill(&mut self) -> Result<(), String> {
        self.buf.reserve(CHUNK);
        let read = self
            .input
            .read_buf(&mut self.buf)
            .await
            .map_err(|e| format!("cannot read {}: {e}", self.name))?;
        self.eof = read == 0;
        Ok(())
    }

    /// The next key and the input bytes it took, if the buffer holds a whole one.
    fn cut(&mut self) -> Result<Option<(Bytes, u64)>, String> {
        match self.format {
            Format::Lines | Format::Hex => {
                let end = match memchr::memchr(b'\n', &self.buf) {
                    Some(newline) => newline + 1,
                    None if self.eof && !self.buf.is_empty() => self.buf.len(),
                    None => {
                        // Refused here, not after reading the line whole (a file without newlines may
                        // be gigabytes).
                        self.check_line_length(self.buf.len())?;
                        return Ok(None);
                    }
                };
                self.check_line_length(end)?;
                let line = self.buf.split_to(end).freeze();
                self.records += 1;
                let text = line.slice(..trim_line_end(&line));
                let key = if self.format == Format::Hex {
                    self.decode_hex(&text)?
                } else {
                    text
                };
                Ok(Some((key, end as u64)))
            }
            Format::Raw => {
                if self.buf.len() < 4 {
                    if self.eof && !self.buf.is_empty() {
                        return Err(format!(
                            "{} ends inside the length of raw key #{}: {} of its 4 bytes (is it --format raw: \
                             a u32 big-endian length, then the key?)",
                            self.name,
                            self.records + 1,
                            self.buf.len()
                        ));
                    }
                    return Ok(None);
                }
                let length =
                    u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]])
                        as usize;
                if length > MAX_KEY_BYTES_LIMIT {
                    return Err(format!(
                        "raw key #{} of {} claims {length} bytes, more than any gate accepts \
                         ({MAX_KEY_BYTES_LIMIT}): is it --format raw (a u32 big-endian length, then the key)?",
                        self.records + 1,
                        self.name
                    ));
                }
                if self.buf.len() < 4 + length {
                    if self.eof {
                        return Err(format!(
                            "{} ends inside raw key #{}: it claims {length} bytes, {} are left",
                            self.name,
                            self.records + 1,
                            self.buf.len() - 4
                        ));
                    }
                    return Ok(None);
                }
                self.buf.advance(4);
                self.records += 1;
                Ok(Some((
                    self.buf.split_to(length).freeze(),
                    4 + length as u64,
                )))
            }
        }
    }

    /// Refuses a line of (at least) `length` bytes that no gate would take as a key: longer than
    /// `MAX_KEY_BYTES_LIMIT` (twice that in hex), line end and spaces around hex allowed for.
    fn check_line_length(&self, length: usize) -> Result<(), String> {
        let (longest, what) = match self.format {
            Format::Hex => (2 * MAX_KEY_BYTES_LIMIT + LINE_SLACK, "hexadecimal digits"),
            _ => (MAX_KEY_BYTES_LIMIT + LINE_SLACK, "bytes"),
        };
        if length <= longest {
            return Ok(());
        }
        Err(format!(
            "line {} of {} is longer than {longest} {what} and no gate takes a key that long (at most \
             {MAX_KEY_BYTES_LIMIT} bytes, or the gate's max_key_bytes); nothing after it was read (is it the \
             right file and --format?)",
            self.records + 1,
            self.name
        ))
    }

    fn decode_hex(&self, text: &[u8]) -> Result<Bytes, String> {
        let trimmed = text.trim_ascii();
        hex::decode(trimmed).map(Bytes::from).map_err(|e| {
            format!(
                "line {} of {} is not hexadecimal ({e}): {}",
                self.records,
                self.name,
                String::from_utf8_lossy(&trimmed[..trimmed.len().min(64)])
            )
        })
    }
}

/// The length of `line` without its `\n` or `\r\n`.
fn trim_line_end(line: &[u8]) -> usize {
    let mut end = line.len();
    if line[..end].ends_with(b"\n") {
        end -= 1;
    }
    if line[..end].ends_with(b"\r") {
        end -= 1;
    }
    end
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Every batch of `input` read as `format` in batches of `size`, as strings.
    async fn batches(
        input: &'static [u8],
        format: Format,
        size: usize,
    ) -> Result<Vec<Vec<Vec<u8>>>, String> {
        let mut reader = KeyReader::new(Box::new(input), "the input".into(), format);
        let mut all = Vec::new();
        while let Some(batch) = reader.next_batch(size).await? {
            all.push(batch.keys.iter().map(|k| k.to_vec()).collect());
        }
        Ok(all)
    }

    #[tokio::test]
    async fn lines_are_keys_byte_for_byte_and_empty_ones_are_skipped() {
        let got = batches(b"a\r\n\nb c\nd", Format::Lines, 2).await.unwrap();
        assert_eq!(
            got,
            vec![vec![b"a".to_vec(), b"b c".to_vec()], vec![b"d".to_vec()]]
        );
    }

    #[tokio::test]
    async fn hex_lines_decode_and_bad_ones_are_named_by_line() {
        let got = batches(b"6869\n ff00 \n", Format::Hex, 10).await.unwrap();
        assert_eq!(got, vec![vec![b"hi".to_vec(), vec![0xff, 0]]]);
        let error = batches(b"6869\nzz\n", Format::Hex, 10).await.unwrap_err();
        assert!(
            error.starts_with("line 2 of the input is not hexadecimal"),
            "{error}"
        );
    }

    /// An endless line (a binary file, a file without newlines) is refused once it is longer than any key,
    /// not read whole: this input never ends.
    #[tokio::test]
    async fn a_line_longer_than_any_key_is_refused_without_reading_it_whole() {
        for format in [Format::Lines, Format::Hex] {
            let endless = tokio::io::AsyncReadExt::chain(&b"6869\n"[..], tokio::io::repeat(b'a'));
            let mut reader = KeyReader::new(Box::new(endless), "the input".into(), format);
            let read = tokio::time::timeout(Duration::from_secs(60), reader.next_batch(10)).await;
            let error = read
                .expect("refused without reading the line whole")
                .unwrap_err();
            assert!(
                error.starts_with("line 2 of the input is longer than")
                    && error.contains("no gate takes a key that long"),
                "{format:?}: {error}"
            );
            assert!(
                reader.buf.len() <= 2 * CHUNK + 2 * MAX_KEY_BYTES_LIMIT,
                "{format:?}: read on"
            );
        }
    }

    #[tokio::test]
    async fn raw_keys_are_length_prefixed_and_truncation_is_an_error() {
        let got = batches(b"\0\0\0\x02hi\0\0\0\x01\n", Format::Raw, 10)
            .await
            .unwrap();
        assert_eq!(got, vec![vec![b"hi".to_vec(), b"\n".to_vec()]]);
        let error = batches(b"\0\0\0\x05hi", Format::Raw, 10).await.unwrap_err();
        assert_eq!(
            error,
            "the input ends inside raw key #1: it claims 5 bytes, 2 are left"
        );
        let error = batches(b"user-1\n", Format::Raw, 10).await.unwrap_err();
        assert!(error.contains("claims 1970496882 bytes"), "{error}");
    }
}
