//! Generates the gRPC contract's Rust types and service traits from `proto/` with a vendored `protoc`,
//! so `cargo build` needs no system protobuf compiler.

use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "../../proto/existence/v1/existence.proto";
    println!("cargo:rerun-if-changed={proto}");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);

    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    // `bytes` fields decode as `bytes::Bytes` slices of the request buffer: no allocation per key.
    config.bytes(["."]);

    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("existence_descriptor.bin"))
        .compile_with_config(config, &[proto], &["../../proto"])?;
    Ok(())
}
