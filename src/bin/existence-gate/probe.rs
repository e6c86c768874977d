//! `existence-gate probe`: the server's gRPC health as an exit code, for container HEALTHCHECKs.

use clap::Args;

use existence_gate::core::config::parse_duration;

#[derive(Debug, Args)]
pub(crate) struct ProbeArgs {
    /// The server's gRPC address, e.g. 127.0.0.1:50051.
    #[arg(long, default_value = "127.0.0.1:50051")]
    addr: String,
    /// The health service name to check ("" = the whole server).
    #[arg(long, default_value = "")]
    service: String,
    /// How long to wait for an answer (e.g. 2s).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    timeout: std::time::Duration,
}

/// Asks the server's health service; Ok(()) only for SERVING.
pub(crate) async fn probe(args: ProbeArgs) -> Result<(), String> {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    let uri = if args.addr.contains("://") {
        args.addr.clone()
    } else {
        format!("http://{}", args.addr)
    };
    let check = async {
        let channel = tonic::transport::Endpoint::from_shared(uri)
            .map_err(|e| format!("invalid --addr {}: {e}", args.addr))?
            .connect()
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", args.addr))?;
        let reply = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: args.service.clone(),
            })
            .await
            .map_err(|status| {
                format!(
                    "health check of {:?} failed: {}",
                    args.service,
                    status.message()
                )
            })?;
        match reply.into_inner().status() {
            ServingStatus::Serving => Ok(()),
            other => Err(format!(
                "service {:?} is {}",
                args.service,
                other.as_str_name()
            )),
        }
    };
    tokio::time::timeout(args.timeout, check)
        .await
        .map_err(|_| format!("no answer from {} within {:?}", args.addr, args.timeout))?
}
