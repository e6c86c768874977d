//! Generates the gate's client stubs from the contract with a vendored `protoc`, so building the client
//! needs no system protobuf compiler. `proto` is a link to the repository's `proto/`, which `cargo package`
//! follows: the packaged crate carries the contract and builds on its own.

use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new("proto");
    let proto = root.join("existence/v1/existence.proto");
    if !proto.exists() {
        return Err(format!(
            "{} not found: in the repository, clients/rust/proto links to proto/ (a checkout without symbolic \
             links lacks it); a packaged crate carries it",
            proto.display()
        )
        .into());
    }
    println!("cargo:rerun-if-changed={}", proto.display());
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    config.bytes(["."]);
    tonic_prost_build::configure()
        .build_server(false)
        .compile_with_config(config, &[proto], &[root.to_path_buf()])?;
    Ok(())
}
