//! TLS for the gRPC port: reading and checking the PEM files, once, at startup, so a bad file stops the start
//! with its path instead of failing each handshake.

use std::path::PathBuf;
use std::sync::Arc;

use super::ServerError;

/// TLS for the gRPC port.
#[derive(Debug, Clone)]
pub struct TlsOptions {
    /// PEM certificate chain of the server.
    pub cert: PathBuf,
    /// PEM private key of the server.
    pub key: PathBuf,
    /// PEM CA bundle: when set, clients must present a certificate it signed (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

impl TlsOptions {
    /// The acceptor for the gRPC port: rustls with the `ring` provider, HTTP/2 offered by ALPN, and client
    /// certificates required and checked against `client_ca` when it is set — as tonic's own TLS does, but
    /// terminated by [`crate::service::listener`], so the handshake timeout covers the TLS handshake too.
    pub(super) fn acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, ServerError> {
        self.config(vec![b"h2".to_vec()])
    }

    /// The acceptor for the RESP port: the same certificates and client checks, no ALPN (Redis clients
    /// offer none).
    pub(super) fn resp_acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, ServerError> {
        self.config(Vec::new())
    }

    fn config(&self, alpn: Vec<Vec<u8>>) -> Result<tokio_rustls::TlsAcceptor, ServerError> {
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
        use tokio_rustls::rustls::server::WebPkiClientVerifier;
        use tokio_rustls::rustls::{RootCertStore, ServerConfig};
        let read = |path: &PathBuf, what: &str| {
            std::fs::read(path).map_err(|e| {
                ServerError::Config(format!(
                    "cannot read the TLS {what} {}: {e}",
                    path.display()
                ))
            })
        };
        let invalid = |what: &str, path: &PathBuf, e: &dyn std::fmt::Display| {
            ServerError::Config(format!("invalid TLS {what} {}: {e}", path.display()))
        };
        let certificates = |path: &PathBuf, what: &str| {
            let pem = read(path, what)?;
            let certificates = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| invalid(what, path, &e))?;
            if certificates.is_empty() {
                return Err(invalid(what, path, &"no PEM certificate in it"));
            }
            Ok(certificates)
        };
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| ServerError::Config(format!("invalid TLS configuration: {e}")))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for certificate in certificates(ca, "client CA")? {
                    roots
                        .add(certificate)
                        .map_err(|e| invalid("client CA", ca, &e))?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(|e| invalid("client CA", ca, &e))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let key = PrivateKeyDer::from_pem_slice(&read(&self.key, "key")?)
            .map_err(|e| invalid("key", &self.key, &e))?;
        let mut config = builder
            .with_single_cert(certificates(&self.cert, "certificate")?, key)
            .map_err(|e| invalid("certificate", &self.cert, &e))?;
        config.alpn_protocols = alpn;
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }
}
