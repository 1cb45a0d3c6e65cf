//! The extern scatter-add routine (`Step::ScatterAdd`): the derivative of a gather, run by Rust
//! code rather than generated, as Inductor falls back to ATen's `scatter_add`.

use minductor_runtime::RuntimeError;

/// One operand of a scatter-add seen with the source's shape: element `p` lives at
/// `offset + Σ p_d · strides[d]`.
pub struct View<'a, T> {
    pub data: &'a [T],
    pub offset: i64,
    pub strides: &'a [i64],
}

impl<T: Copy> View<'_, T> {
    /// Checks that every position of `shape` addresses an element of `data`.
    pub fn check(&self, shape: &[usize], what: &str) -> Result<(), RuntimeError> {
        if shape.contains(&0) {
            // An empty view reads no element (its users loop over `shape`).
            return Ok(());
        }
        let (mut low, mut high) = (self.offset, self.offset);
        for (&n, &s) in shape.iter().zip(self.strides) {
            let span = (n.saturating_sub(1)) as i64 * s;
            if span < 0 {
                low += span;
            } else {
                high += span;
            }
        }
        if low < 0 || high >= self.data.len() as i64 {
            return Err(RuntimeError::Unsupported(format!(
                "{what}: the view reaches outside its buffer \
                 (elements {low}..={high} of {})",
                self.data.len()
            )));
        }
        Ok(())
    }
}

/// `out = 0; out[p with p[dim] = index[p]] += src[p]` for every position `p` of `shape` (the
/// source's), in row-major order, so the sums are the same on every run. An index outside
/// `0..out_shape[dim]` is an error naming it; `out` is left partly written then.
pub fn scatter_add(
    index: View<'_, i64>,
    src: View<'_, f32>,
    shape: &[usize],
    out: &mut [f32],
    out_shape: &[usize],
    dim: usize,
) -> Result<(), RuntimeError> {
    out.fill(0.0);
    let count: usize = shape.iter().product();
    if count == 0 {
        return Ok(());
    }
    index.check(shape, "index")?;
    src.check(shape, "source")?;
    let mut out_strides = vec![1usize; out_shape.len()];
    for d in (0..out_shape.len().saturating_sub(1)).rev() {
        out_strides[d] = out_strides[d + 1] * out_shape[d + 1];
    }
    if out.len() != out_shape.iter().product::<usize>() || shape.len() != out_shape.len() {
        return Err(RuntimeError::Unsupported(
            "scatter_add: the output buffer does not match its shape".into(),
        ));
    }
    let rows = out_shape[dim];
    let mut position = vec![0usize; shape.len()];
    for _ in 0..count {
        let (mut at_index, mut at_src, mut at_out) = (index.offset, src.offset, 0usize);
        for d in 0..shape.len() {
            at_index += position[d] as i64 * index.strides[d];
            at_src += position[d] as i64 * src.strides[d];
            if d != dim {
                at_out += position[d] * out_strides[d];
            }
        }
        let row = index.data[at_index as usize];
        let row = usize::try_from(row)
            .ok()
            .filter(|&r| r < rows)
            .ok_or_else(|| {
                RuntimeError::Data(format!(
                    "scatter_add: index {row} is out of range for dim {dim} of size {rows}"
                ))
            })?;
        out[at_out + row * out_strides[dim]] += src.data[at_src as usize];
        for d in (0..shape.len()).rev() {
            position[d] += 1;
            if position[d] < shape[d] {
                break;
            }
            position[d] = 0;
        }
    }
    Ok(())
}
