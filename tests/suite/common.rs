//! The test kit (`crates/testkit`) under the name every module of the suite uses for it: `common::start`,
//! `common::nats::Nats`, or all of it with `use common::*`.

pub use existence_gate_testkit::*;
