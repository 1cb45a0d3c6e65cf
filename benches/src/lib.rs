//! The workloads the criterion benches run live in the tooling crate, `minductor_tools::workloads`, so
//! that the `minductor bench` command and these benches measure the same suite.

pub use minductor_tools::workloads::*;
