//! `[[tokens]]` entries for a test gate's configuration, written in one place: the gate stores a token's
//! SHA-256 (`existence-gate hash-token`), never the token, so every entry a test writes needs the same
//! hashing and the same four keys; a test names the token it will send and what it may do.

use existence_gate::service::auth::hash_token;

/// A `[[tokens]]` entry (its own lines, ending in a newline): `name` holds `token` with `roles` (`read`,
/// `write`, `admin`) on `namespaces` (`*` for every one). Names, roles and namespaces are plain ASCII.
pub fn token_entry(name: &str, token: &str, roles: &[&str], namespaces: &[&str]) -> String {
    format!(
        "[[tokens]]\nname = \"{name}\"\nsha256 = \"{}\"\nroles = {}\nnamespaces = {}\n",
        hash_token(token),
        list(roles),
        list(namespaces)
    )
}

/// `["a", "b"]`: a TOML array of strings.
fn list(items: &[&str]) -> String {
    let quoted: Vec<String> = items.iter().map(|item| format!("\"{item}\"")).collect();
    format!("[{}]", quoted.join(", "))
}
