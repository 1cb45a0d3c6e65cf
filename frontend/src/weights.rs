//! Loading tensors by name from a safetensors file (the format PyTorch and Hugging Face save).

use crate::train::TrainError;
use minductor_ir::DType;
use minductor_runtime::Tensor;
use std::collections::HashMap;
use std::path::Path;

/// Every tensor of the safetensors file at `path`, by name. Supported dtypes: f32, f16, bf16,
/// i64 and bool; any other is an error naming the tensor.
pub fn load_safetensors(path: &Path) -> Result<HashMap<String, Tensor>, TrainError> {
    let fail = |message: String| TrainError::Weights {
        path: path.display().to_string(),
        message,
    };
    let bytes = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
    let file = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| fail(e.to_string()))?;
    let mut out = HashMap::new();
    for (name, view) in file.tensors() {
        use safetensors::Dtype as S;
        let dtype = match view.dtype() {
            S::F64 => DType::F64,
            S::F32 => DType::F32,
            S::F16 => DType::F16,
            S::BF16 => DType::BF16,
            S::I64 => DType::I64,
            S::BOOL => DType::Bool,
            other => return Err(fail(format!("{name}: unsupported dtype {other:?}"))),
        };
        let t = Tensor::from_bytes(dtype, view.shape(), view.data())
            .map_err(|e| fail(format!("{name}: {e}")))?;
        out.insert(name, t);
    }
    Ok(out)
}
