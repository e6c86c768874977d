//! Durations as the configuration writes them (`500ms`, `90s`, `7d`, `forever` for a retention).

use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::filter::Retention;

/// Parses `500ms`, `90s`, `10m`, `2h`, `7d` or `1w`.
///
/// ```
/// use existence_gate_core::config::parse_duration;
/// assert_eq!(parse_duration("90s").unwrap().as_secs(), 90);
/// assert_eq!(parse_duration("7d").unwrap().as_secs(), 7 * 86_400);
/// assert!(parse_duration("7 days").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(|| {
        format!("`{text}` has no unit: write it like 500ms, 90s, 10m, 2h, 7d or 1w")
    })?;
    let (number, unit) = text.split_at(split);
    let value: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration like 500ms, 90s, 10m, 2h, 7d or 1w"))?;
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "w" => 604_800_000,
        _ => {
            return Err(format!(
                "`{text}` has unknown unit `{unit}`: use ms, s, m, h, d or w"
            ))
        }
    };
    value
        .checked_mul(unit_ms)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("`{text}` is too long"))
}

pub(super) fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse_duration(&text).map_err(serde::de::Error::custom)
}

pub(super) fn retention<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Retention, D::Error> {
    let text = String::deserialize(deserializer)?;
    if text.trim() == "forever" {
        return Ok(Retention::Forever);
    }
    parse_duration(&text)
        .map(|d| Retention::Millis(d.as_millis() as u64))
        .map_err(|e| serde::de::Error::custom(format!("{e}, or `forever`")))
}
