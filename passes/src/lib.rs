//! The pass pipeline over the graph IR and the kernel IR (`minductor_kernel_ir`):
//! graph passes `decompose` → `autodiff` → `simplify` → `partition` (joint graphs), `freeze`,
//! `sink_cats` (before `fuse`);
//! scheduling passes `fuse` (graph → kernel IR) → `fuse_horizontal` → `fuse_epilogues` →
//! `store_once` → `split_transposes` → `choose_loop_order` → `plan_buffers`.
//!
//! Each pass is one file with one entry function from one data structure to the next; each data
//! structure prints as text. The kernel IR's verifier (`minductor_kernel_ir::verify_program`)
//! runs after each kernel-IR pass; `Graph::verify` after each graph pass.

mod attention;
mod autodiff;
mod decompose;
mod epilogue;
mod freeze;
mod fuse;
mod horizontal;
mod loop_order;
mod partition;
mod plan_buffers;
mod simplify;
mod sink_cats;
mod split_transposes;
mod store_once;

pub use autodiff::{autodiff, AutodiffError, Joint, ERF_GRAD_FLOOR};
pub use decompose::decompose;
pub use epilogue::fuse_epilogues;
pub use freeze::{freeze, Frozen};
pub use fuse::{fuse, fuse_counting, FuseError, FuseStats};
pub use horizontal::fuse_horizontal;
pub use loop_order::{choose_loop_order, wants_outer_reduction};
pub use partition::{partition, Partition, PartitionOptions, SavedValue};
pub use plan_buffers::plan_buffers;
pub use simplify::simplify;
pub use sink_cats::sink_cats;
pub use split_transposes::split_transposes;
pub use store_once::store_once;
