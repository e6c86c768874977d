//! The fuzz targets' checks; `tests/suite/fuzz_harnesses.rs` in the main crate includes the same file.

pub mod harness;
