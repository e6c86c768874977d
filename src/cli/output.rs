//! What the commands print: keys (which are bytes) as text or JSON, the contract's enum values by their short
//! names, and lines on standard output.

use std::io::Write;

use serde_json::{Map, Value};

/// A key as text: itself when it is UTF-8 without control characters or spaces (so columns stay columns),
/// else `0x` and its bytes in hex. For exact bytes use `--json`, where non-UTF-8 keys come as `key_hex`.
pub fn key_text(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(text) if !text.chars().any(|c| c.is_control() || c.is_whitespace()) => text.to_string(),
        _ => format!("0x{}", hex::encode(key)),
    }
}

/// Puts `key` into `object` as `"key": "text"` when it is UTF-8, else as `"key_hex": "6b6579"`: JSON strings
/// hold only Unicode, and a lossy conversion would print a different key.
pub fn insert_key(object: &mut Map<String, Value>, key: &[u8]) {
    match std::str::from_utf8(key) {
        Ok(text) => object.insert("key".into(), text.into()),
        Err(_) => object.insert("key_hex".into(), hex::encode(key).into()),
    };
}

/// A contract enum value without its type prefix: `ANSWER_MAY_EXIST` → `MAY_EXIST`.
pub fn short_name(name: &'static str, prefix: &str) -> &'static str {
    name.strip_prefix(prefix).unwrap_or(name)
}

/// `n` and `noun`, plural unless `n` is 1: `1 key`, `2 keys`, `1,000 keys`.
pub fn count(n: u64, noun: &str) -> String {
    let s = if n == 1 { "" } else { "s" };
    format!("{} {noun}{s}", indicatif::HumanCount(n))
}

/// Writes `text` and a newline to standard output (flushed: line-buffered), or says why it could not.
pub fn line(text: &str) -> Result<(), String> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{text}").map_err(stdout_failed)
}

/// Why standard output could not be written.
pub fn stdout_failed(error: std::io::Error) -> String {
    format!("cannot write to standard output: {error}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_print_as_text_only_when_that_is_unambiguous() {
        assert_eq!(key_text(b"user-42"), "user-42");
        assert_eq!(key_text(b"two words"), "0x74776f20776f726473");
        assert_eq!(key_text(&[0xff, 0x00]), "0xff00");
        let mut object = Map::new();
        insert_key(&mut object, &[0xff]);
        assert_eq!(Value::Object(object).to_string(), r#"{"key_hex":"ff"}"#);
        assert_eq!(
            (count(1, "key"), count(1_000, "key")),
            ("1 key".into(), "1,000 keys".into())
        );
    }
}
