//! How a command reaches the gate: the address, the token and TLS files every client subcommand takes, and
//! the one channel they open with them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Status};

use crate::client::failure;
use crate::proto::admin_client::AdminClient;
use crate::proto::existence_gate_client::ExistenceGateClient;

/// How long connecting may take before the gate counts as unreachable: a gate that accepts connections
/// answers in milliseconds, and a blackholed address should fail a command, not hang it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the gate is and how to authenticate to it.
#[derive(Debug, Clone, Args)]
pub struct ConnectArgs {
    /// The gate's gRPC address: http://HOST:PORT, or https://HOST:PORT with --tls-ca. Without a scheme,
    /// https when a --tls flag is given, else http.
    #[arg(
        long,
        env = "EXISTENCE_GATE_ADDR",
        default_value = "http://127.0.0.1:50051"
    )]
    pub addr: String,
    /// A token from the gate's `[[tokens]]` (sent as `authorization: Bearer TOKEN`); needed when the gate has
    /// tokens configured.
    #[arg(long, env = "EXISTENCE_GATE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// PEM CA bundle the gate's certificate chains to (TLS).
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate, for a gate that requires mutual TLS.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// Adds the bearer token, if any, to every call.
#[derive(Debug, Clone)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// The gate client type every command uses.
pub type GateClient = ExistenceGateClient<InterceptedService<Channel, Bearer>>;
/// The admin client type.
pub type Admin = AdminClient<InterceptedService<Channel, Bearer>>;

/// An open connection to the gate: cheap to clone, one HTTP/2 connection shared by every call.
#[derive(Debug, Clone)]
pub struct Gate {
    channel: Channel,
    bearer: Bearer,
}

impl Gate {
    /// Connects to the gate `args` names; fails with a one-line reason when it cannot be reached.
    pub async fn connect(args: &ConnectArgs) -> Result<Self, String> {
        let bearer = match &args.token {
            None => Bearer(None),
            Some(token) => Bearer(Some(format!("Bearer {}", token.trim()).parse().map_err(
                |_| "--token must be printable ASCII without line breaks".to_string(),
            )?)),
        };
        let (uri, tls) = endpoint_uri(args)?;
        let mut endpoint = Endpoint::from_shared(uri.clone())
            .map_err(|e| format!("invalid --addr {}: {e}", args.addr))?
            .connect_timeout(CONNECT_TIMEOUT);
        if let Some(tls) = tls {
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| format!("cannot use the TLS files: {}", failure::chain(&e)))?;
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| failure::unreachable(&uri, &e))?;
        Ok(Self { channel, bearer })
    }

    /// A client of the `ExistenceGate` service. Messages are limited by the gate's --max-message-bytes, not
    /// by tonic's 4 MiB default for decoding.
    pub fn gate(&self) -> GateClient {
        ExistenceGateClient::with_interceptor(self.channel.clone(), self.bearer.clone())
            .max_decoding_message_size(usize::MAX)
    }

    /// A client of the `Admin` service.
    pub fn admin(&self) -> Admin {
        AdminClient::with_interceptor(self.channel.clone(), self.bearer.clone())
            .max_decoding_message_size(usize::MAX)
    }
}

/// The URI to dial, and the TLS settings when the --tls flags ask for it.
fn endpoint_uri(args: &ConnectArgs) -> Result<(String, Option<ClientTlsConfig>), String> {
    let wants_tls = args.tls_ca.is_some() || args.tls_cert.is_some();
    let uri = match args.addr.split_once("://") {
        Some(_) => args.addr.clone(),
        None if wants_tls => format!("https://{}", args.addr),
        None => format!("http://{}", args.addr),
    };
    let https = uri.starts_with("https://");
    if !https && !uri.starts_with("http://") {
        return Err(format!(
            "invalid --addr {}: use http://HOST:PORT or https://HOST:PORT",
            args.addr
        ));
    }
    if wants_tls && !https {
        return Err(format!(
            "--addr {} is plaintext but TLS files were given: use https://",
            args.addr
        ));
    }
    if !https {
        return Ok((uri, None));
    }
    let ca = args.tls_ca.as_deref().ok_or_else(|| {
        format!(
            "--addr {} uses TLS: pass --tls-ca with the CA bundle the gate's certificate chains to",
            args.addr
        )
    })?;
    let mut tls =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca, "--tls-ca")?));
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        tls = tls.identity(Identity::from_pem(
            read(cert, "--tls-cert")?,
            read(key, "--tls-key")?,
        ));
    }
    Ok((uri, Some(tls)))
}

fn read(path: &Path, flag: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {flag} {}: {e}", path.display()))
}
