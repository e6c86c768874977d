//! Who may do what: bearer tokens with roles on namespaces.
//!
//! Tokens are configured as SHA-256 hashes (`existence-gate hash-token` prints one), never in plain text, so
//! the configuration file is not a secret. Each grants roles — `read` (MayExist, BatchMayExist,
//! SubscribeInvalidations), `write` (Add, RecordAbsent), `admin` (the Admin service) — on a list of
//! namespaces or `*`. With no token configured the gate is open.
//!
//! A token's permission is checked against the namespace *name* before the namespace is looked up, so a
//! refusal never tells whether a namespace exists.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

pub use crate::core::config::{Role, TokenConfig};

/// What a token grants.
#[derive(Debug, Clone)]
struct Grant {
    name: String,
    roles: Vec<Role>,
    /// `None` = every namespace.
    namespaces: Option<Vec<String>>,
}

/// Where a role is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// On this namespace, by its configured name: the gRPC layer has already resolved "" to `default`
    /// ([`crate::grpc::resolve_namespace`]).
    Namespace(&'a str),
    /// On every namespace (`*`), e.g. a snapshot of the whole gate.
    All,
    /// On at least one namespace, e.g. listing the namespaces one administers.
    Any,
}

/// Why a call was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// No token, a malformed header, or an unknown token.
    Unauthenticated(&'static str),
    /// A known token without the role on the namespace.
    PermissionDenied(String),
}

/// The hex SHA-256 of `token`, as configuration files hold it.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Checks bearer tokens against the configured grants.
#[derive(Debug, Clone, Default)]
pub struct Authorizer {
    /// Grants by token hash; empty = open gate.
    grants: HashMap<[u8; 32], Grant>,
}

impl Authorizer {
    /// An authorizer for `tokens`; errors name the token entry that is invalid.
    pub fn new(tokens: &[TokenConfig]) -> Result<Self, String> {
        crate::core::config::validate_tokens(tokens)?;
        let grants = tokens
            .iter()
            .map(|token| {
                let digest = token.digest().expect("validated above");
                let namespaces =
                    (!token.namespaces.iter().any(|n| n == "*")).then(|| token.namespaces.clone());
                let grant = Grant {
                    name: token.name.clone(),
                    roles: token.roles.clone(),
                    namespaces,
                };
                (digest, grant)
            })
            .collect();
        Ok(Self { grants })
    }

    /// Whether any token is configured (otherwise every call is allowed).
    pub fn is_enabled(&self) -> bool {
        !self.grants.is_empty()
    }

    /// Checks that the `authorization` header value grants `role` in `scope`. Returns the token's label.
    pub fn check(
        &self,
        authorization: Option<&str>,
        role: Role,
        scope: Scope<'_>,
    ) -> Result<Option<&str>, Denied> {
        if !self.is_enabled() {
            return Ok(None);
        }
        let grant = self.grant(authorization)?;
        let role_ok = grant.roles.contains(&role);
        let scope_ok = match (&grant.namespaces, scope) {
            (None, _) | (Some(_), Scope::Any) => true,
            (Some(_), Scope::All) => false,
            (Some(allowed), Scope::Namespace(name)) => allowed.iter().any(|a| a == name),
        };
        if role_ok && scope_ok {
            Ok(Some(&grant.name))
        } else {
            let target = match scope {
                Scope::Namespace(name) => format!("namespace {name:?}"),
                Scope::All => "every namespace".to_string(),
                Scope::Any => "any namespace".to_string(),
            };
            Err(Denied::PermissionDenied(format!(
                "this token does not grant {} on {target}",
                match role {
                    Role::Read => "read",
                    Role::Write => "write",
                    Role::Admin => "admin",
                    Role::Mirror => "mirror",
                }
            )))
        }
    }

    /// The name of the token in `authorization`, or why it is not one of the configured tokens (a RESP
    /// `AUTH` checks the token when it is sent, and the roles at each command).
    pub fn token_name(&self, authorization: Option<&str>) -> Result<&str, Denied> {
        self.grant(authorization).map(|grant| grant.name.as_str())
    }

    /// Whether the token in `authorization` may use `role` on `namespace` (for filtering lists).
    pub fn allows(&self, authorization: Option<&str>, role: Role, namespace: &str) -> bool {
        self.check(authorization, role, Scope::Namespace(namespace))
            .is_ok()
    }

    fn grant(&self, authorization: Option<&str>) -> Result<&Grant, Denied> {
        let header = authorization.ok_or(Denied::Unauthenticated(
            "missing authorization metadata: send `authorization: Bearer <token>`",
        ))?;
        let token = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .ok_or(Denied::Unauthenticated(
                "authorization metadata must be `Bearer <token>`",
            ))?;
        let digest: [u8; 32] = Sha256::digest(token.trim().as_bytes()).into();
        self.grants
            .get(&digest)
            .ok_or(Denied::Unauthenticated("unknown token"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn authorizer() -> Authorizer {
        Authorizer::new(&[
            TokenConfig {
                name: "users-reader".into(),
                sha256: hash_token("r-secret"),
                roles: vec![Role::Read],
                namespaces: vec!["users".into(), "default".into()],
            },
            TokenConfig {
                name: "ops".into(),
                sha256: hash_token("a-secret"),
                roles: vec![Role::Read, Role::Write, Role::Admin],
                namespaces: vec!["*".into()],
            },
        ])
        .unwrap()
    }

    #[test]
    fn tokens_grant_roles_on_namespaces() {
        let auth = authorizer();
        assert_eq!(
            auth.check(
                Some("Bearer r-secret"),
                Role::Read,
                Scope::Namespace("users")
            ),
            Ok(Some("users-reader"))
        );
        assert!(
            auth.check(Some("Bearer r-secret"), Role::Read, Scope::Namespace(""))
                .is_err(),
            "\"\" is resolved by the gRPC layer, never here"
        );
        assert!(matches!(
            auth.check(
                Some("Bearer r-secret"),
                Role::Write,
                Scope::Namespace("users")
            ),
            Err(Denied::PermissionDenied(_))
        ));
        assert!(matches!(
            auth.check(
                Some("Bearer r-secret"),
                Role::Read,
                Scope::Namespace("orders")
            ),
            Err(Denied::PermissionDenied(_))
        ));
        assert!(auth
            .check(Some("Bearer a-secret"), Role::Admin, Scope::All)
            .is_ok());
        assert!(auth
            .check(Some("Bearer r-secret"), Role::Admin, Scope::All)
            .is_err());
        assert!(auth
            .check(Some("Bearer r-secret"), Role::Read, Scope::Any)
            .is_ok());
        assert!(auth
            .check(Some("Bearer r-secret"), Role::Admin, Scope::Any)
            .is_err());
    }

    #[test]
    fn missing_malformed_and_unknown_tokens_are_unauthenticated() {
        let auth = authorizer();
        for header in [
            None,
            Some("r-secret"),
            Some("Basic abc"),
            Some("Bearer nope"),
        ] {
            assert!(
                matches!(
                    auth.check(header, Role::Read, Scope::Namespace("users")),
                    Err(Denied::Unauthenticated(_))
                ),
                "{header:?}"
            );
        }
    }

    #[test]
    fn no_tokens_means_open() {
        let auth = Authorizer::default();
        assert!(!auth.is_enabled());
        assert_eq!(auth.check(None, Role::Admin, Scope::All), Ok(None));
    }

    #[test]
    fn bad_entries_are_named() {
        let bad = TokenConfig {
            name: "x".into(),
            sha256: "zz".into(),
            roles: vec![Role::Read],
            namespaces: vec!["*".into()],
        };
        assert!(Authorizer::new(&[bad])
            .unwrap_err()
            .contains("tokens[0] (\"x\").sha256"));
    }

    #[test]
    fn the_hash_is_hex_sha256() {
        assert_eq!(
            hash_token("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
