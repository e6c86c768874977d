//! A throwaway PKI for the TLS tests: a CA and the two leaves mutual TLS needs, made fresh by rcgen for each
//! test so that no key material is committed. The suite's and the Rust client's TLS tests share it.

/// A CA, a server certificate for `localhost` and a client certificate it signed, all PEM.
pub struct Pki {
    /// The CA's certificate: what the server trusts for client certificates and clients for the server's.
    pub ca: String,
    /// The server's certificate (for `localhost`) and key.
    pub server_cert: String,
    pub server_key: String,
    /// The client's certificate (for `client`) and key.
    pub client_cert: String,
    pub client_key: String,
}

/// A fresh [`Pki`].
pub fn new_pki() -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::from_params(&ca_params, &ca_key);
    let leaf = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf("localhost");
    let (client_cert, client_key) = leaf("client");
    Pki {
        ca: ca.pem(),
        server_cert,
        server_key,
        client_cert,
        client_key,
    }
}
