//! Bearer tokens (`[[tokens]]`): each one's stored hash, roles and namespaces.

use serde::Deserialize;

/// A role a token can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Lookups and subscriptions.
    Read,
    /// Add and RecordAbsent.
    Write,
    /// The Admin service.
    Admin,
    /// Attaching a mirror: a copy of a namespace's filter and the secret seed of its hash, which lets the
    /// holder find keys that pass the filter — so not part of `read`.
    Mirror,
}

/// One configured token.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// A label for logs (never the token).
    pub name: String,
    /// Hex SHA-256 of the token.
    pub sha256: String,
    /// Roles granted.
    pub roles: Vec<Role>,
    /// Namespaces the roles apply to; `*` for all.
    pub namespaces: Vec<String>,
}

/// Checks every `[[tokens]]` entry; errors name the entry that is invalid. The service's
/// `auth::Authorizer` builds its grants from entries that passed.
pub fn validate_tokens(tokens: &[TokenConfig]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for (i, token) in tokens.iter().enumerate() {
        let where_ = format!("tokens[{i}] ({:?})", token.name);
        let digest = token.digest().ok_or_else(|| {
            format!("{where_}.sha256 must be 64 hex digits (run `existence-gate hash-token`)")
        })?;
        if token.roles.is_empty() {
            return Err(format!(
                "{where_}.roles must name at least one of read, write, admin"
            ));
        }
        if token.namespaces.is_empty() {
            return Err(format!("{where_}.namespaces must list namespaces or \"*\""));
        }
        if !seen.insert(digest) {
            return Err(format!("{where_} repeats the hash of an earlier token"));
        }
    }
    Ok(())
}

impl TokenConfig {
    /// The configured hash as bytes, if it is 64 hex digits.
    pub fn digest(&self) -> Option<[u8; 32]> {
        hex::decode(self.sha256.trim())
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
    }
}
