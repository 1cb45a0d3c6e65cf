//! The runtime: tensors, the reference interpreter (eager backend and test oracle), and the
//! `Executable` trait every backend's compiled artifact implements.

mod error;
mod executable;
mod interpret;
pub use interpret::interpret;
mod tensor;

pub use error::RuntimeError;
pub use executable::{check_inputs, Executable};
pub use tensor::{contiguous_strides, Element, Storage, Tensor, BUFFER_ALIGN};
