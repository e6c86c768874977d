//! `existence-gate hash-token`: the SHA-256 a `[[tokens]]` entry stores instead of the token.

/// Prints the hash of `token` (or of the first line of standard input).
pub(crate) fn hash_token(token: Option<String>) -> Result<(), String> {
    let token = match token {
        Some(token) => token,
        None => {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .map_err(|e| format!("cannot read the token from standard input: {e}"))?;
            line.trim_end_matches(['\r', '\n']).to_string()
        }
    };
    if token.is_empty() {
        return Err("the token is empty".to_string());
    }
    println!("{}", existence_gate::service::auth::hash_token(&token));
    Ok(())
}
