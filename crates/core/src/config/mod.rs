//! Configuration: per-namespace sizing and TTLs, and the service-wide request limits, read from a TOML file.
//!
//! ```toml
//! [limits]
//! max_batch_keys = 10000
//!
//! [namespaces.users]
//! expected_keys = 50000000
//! false_positive_rate = 0.01
//! retention = "30d"
//! windows = 8
//! missing_ttl = "60s"
//! ```
//!
//! ```toml
//! [[tokens]]
//! name = "checkout"
//! sha256 = "..."          # existence-gate hash-token <token>
//! roles = ["read", "write"]
//! namespaces = ["users"]  # or ["*"]
//! ```
//!
//! Every field has a default; unknown fields and invalid values are startup errors that name the field.
//! The `default` namespace always exists (a `[namespaces.default]` table tunes it).
//!
//! The files: `namespace_settings.rs` (a namespace's sizing and TTLs), `limits.rs` (`[limits]`),
//! `mirrors.rs` (`[mirrors]`), `tokens.rs` (`[[tokens]]`), `duration.rs` (how durations are written); this file holds the whole configuration, its
//! parsing and the checks that span its parts (namespace names).

mod duration;
mod limits;
mod mirrors;
mod namespace_settings;
mod tokens;

#[cfg(test)]
mod tests;

pub use duration::parse_duration;
pub use limits::{Limits, MAX_KEY_BYTES_LIMIT};
pub use mirrors::Mirrors;
pub use namespace_settings::{NamespaceSettings, MAX_TOMBSTONES};
pub use tokens::{validate_tokens, Role, TokenConfig};

use std::collections::BTreeMap;

use serde::Deserialize;

/// The namespace an empty namespace string means.
pub const DEFAULT_NAMESPACE: &str = "default";
/// Longest namespace name.
const MAX_NAMESPACE_LEN: usize = 128;

/// The whole configuration: limits and namespaces (always including `default`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateConfig {
    /// Request limits.
    #[serde(default)]
    pub limits: Limits,
    /// Namespaces by name.
    #[serde(default)]
    pub namespaces: BTreeMap<String, NamespaceSettings>,
    /// Bearer tokens (`[[tokens]]`); none = the gate is open to anyone who can reach it.
    #[serde(default)]
    pub tokens: Vec<TokenConfig>,
    /// Client-side mirrors of filters (`[mirrors]`); off unless `max_per_namespace` is set.
    #[serde(default)]
    pub mirrors: Mirrors,
}

impl Default for GateConfig {
    fn default() -> Self {
        Self::from_toml("").expect("the empty configuration is valid")
    }
}

/// A configuration that cannot be used.
#[derive(Debug)]
pub enum ConfigError {
    /// The TOML is malformed, has an unknown field or a value of the wrong type.
    Parse(String),
    /// A value is out of range.
    Invalid { field: String, problem: String },
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Parse(message) => write!(f, "invalid config: {message}"),
            Self::Invalid { field, problem } => write!(f, "invalid config: {field} {problem}"),
        }
    }
}

impl std::error::Error for ConfigError {}

impl GateConfig {
    /// Parses and validates TOML text.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let mut config: GateConfig =
            toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        config
            .namespaces
            .entry(DEFAULT_NAMESPACE.to_string())
            .or_default();
        config.validate()?;
        Ok(config)
    }

    /// Checks every value; a caller that changes one after parsing (a command-line override) calls it again.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.limits.validate()?;
        self.mirrors.validate()?;
        validate_tokens(&self.tokens).map_err(|problem| ConfigError::Invalid {
            field: "tokens".to_string(),
            problem,
        })?;
        for (name, settings) in &self.namespaces {
            validate_namespace_name(name)?;
            settings.validate(name)?;
        }
        refuse_look_alike_names(self.namespaces.keys())?;
        Ok(())
    }

    /// Bytes all namespaces hold at their configured sizes (see
    /// [`NamespaceSettings::bytes_at_capacity`]), their replay buffers full.
    pub fn bytes_at_capacity(&self) -> u64 {
        self.namespaces
            .values()
            .map(|settings| {
                let replay = self
                    .limits
                    .replay_buffer_bytes_for(settings.filter_spec().initial_bytes());
                settings.bytes_at_capacity().saturating_add(replay as u64)
            })
            .fold(0, u64::saturating_add)
    }

    /// Refuses a configuration whose namespaces would not fit in `memory` bytes at their configured sizes:
    /// better a startup error naming the largest namespace than a server that reports ready, then dies
    /// allocating a filter on its first `Add` (and again on every replay).
    pub fn check_fits(&self, memory: u64) -> Result<(), ConfigError> {
        let needed = self.bytes_at_capacity();
        if needed <= memory {
            return Ok(());
        }
        let (name, largest) = self
            .namespaces
            .iter()
            .max_by_key(|(_, settings)| settings.bytes_at_capacity())
            .expect("default always exists");
        let filter_bytes = largest.filter_spec().initial_bytes();
        let field = if filter_bytes >= largest.bytes_at_capacity() / 2 {
            "expected_keys"
        } else {
            "max_tombstones"
        };
        Err(ConfigError::Invalid {
            field: format!("namespaces.{name}.{field}"),
            problem: format!(
                "makes the namespaces need {needed} bytes at their configured sizes ({name}: {} bytes, \
                 of which {filter_bytes} of filter), more than the {memory} bytes of memory available; \
                 lower expected_keys, false_positive_rate or max_tombstones",
                largest.bytes_at_capacity()
            ),
        })
    }
}

/// Names are case-sensitive, so `Users` and `users` would be two key spaces: a typo away from writing keys
/// where no reader looks. Names that differ only in case are refused.
fn refuse_look_alike_names<'a>(names: impl Iterator<Item = &'a String>) -> Result<(), ConfigError> {
    let mut seen: BTreeMap<String, &str> = BTreeMap::new();
    for name in names {
        if let Some(other) = seen.insert(name.to_ascii_lowercase(), name) {
            return Err(ConfigError::Invalid {
                field: format!("namespaces.{name}"),
                problem: format!(
                    "differs from namespace {other:?} only in case: names are case-sensitive, so these \
                     would be two key spaces; rename one"
                ),
            });
        }
    }
    Ok(())
}

fn validate_namespace_name(name: &str) -> Result<(), ConfigError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAMESPACE_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if valid {
        Ok(())
    } else {
        Err(ConfigError::Invalid {
            field: format!("namespaces.{name:?}"),
            problem: format!(
                "is not a valid name: use 1 to {MAX_NAMESPACE_LEN} of A-Z a-z 0-9 _ - ."
            ),
        })
    }
}
