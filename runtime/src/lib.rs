//! The runtime: tensors, the reference interpreter (eager backend and test oracle), and the
//! `Executable` trait every backend's compiled artifact implements.

mod block_cache;
mod error;
mod executable;
mod interpret;
mod pages;
pub use interpret::{interpret, interpret_within, interpreter_peak_bytes};
mod tensor;
pub mod threads;

pub use block_cache::{block_cache_limit, release_cached_blocks, set_block_cache_limit};
pub use error::RuntimeError;
pub use executable::{
    check_inputs, memory_limit_from_env, output_destination, parse_memory_size, Executable,
    StepPartition, StepTiming, WorkUnit,
};
pub use tensor::{byte_size, contiguous_strides, Element, Storage, Tensor, BUFFER_ALIGN};
pub use threads::{num_threads, set_num_threads};
