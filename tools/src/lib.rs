//! minductor's tooling, kept out of the library so that it does not depend on clap or plotters:
//! the workload suite (`workloads`, PyTorch's `../shared/peers/torch_suite.py` in Rust), the
//! benchmark harness (`bench`), the machine probe (`probe`: copy bandwidth, FMA peaks, GEMM
//! speed), the golden-case runner (`golden`, PyTorch reference data), the fusion report
//! (`report`) and a counting allocator (`heap`). The `minductor` command line (`src/bin/minductor.rs`) drives them.

pub mod bench;
pub mod golden;
pub mod heap;
pub mod probe;
pub mod pt2;
pub mod report;
pub mod workloads;
