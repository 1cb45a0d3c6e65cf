//! The reference interpreter: minductor's `eager` backend and the oracle every compiled result is
//! tested against.
//!
//! Every value is held as contiguous row-major data: `f64` for all float dtypes, each op computed
//! in f64 and its result rounded to the op's dtype (f32, f16, bf16: once, correctly; f64: not at
//! all), so narrow dtypes round after every op as PyTorch eager does, `i64`, or `bool`. Each op
//! allocates its result. Composite ops are computed directly rather than by decomposing them into
//! prims, so the interpreter stays an independent check on `passes::decompose`.

use crate::{check_inputs, contiguous_strides, RuntimeError, Tensor};
use half::{bf16, f16};
use minductor_ir::{BinaryOp, CompareOp, DType, Graph, Op, ReduceOp, SliceFrom, UnaryOp};
use std::borrow::Cow;

/// Evaluates `graph` op by op (both composite and prim ops), each op allocating its result.
/// This is minductor's `eager` backend and the oracle every compiled result is tested against.
pub fn interpret(graph: &Graph, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
    interpret_within(graph, inputs, None)
}

/// [`interpret`], refusing with `OutOfMemory` before any op runs when the values it would hold
/// at once ([`interpreter_peak_bytes`]) pass `memory_limit`. Without a limit, each op whose
/// result takes 1 MiB or more first asks the allocator for that much and gives it back, so an
/// op whose result cannot be allocated is `OutOfMemory` (the interpreter's ops allocate with
/// `Vec`, which would abort the process).
pub fn interpret_within(
    graph: &Graph,
    inputs: &[Tensor],
    memory_limit: Option<usize>,
) -> Result<Vec<Tensor>, RuntimeError> {
    check_inputs(graph, inputs)?;
    let sizes = static_sizes(graph)?;
    if let Some(limit) = memory_limit {
        let peak = peak_bytes(graph, &sizes);
        if peak > limit {
            return Err(RuntimeError::out_of_memory(
                peak,
                format!("the interpreter's values (the memory limit is {limit} bytes)"),
            ));
        }
    }

    let mut input_position = vec![None; graph.len()];
    for (position, id) in graph.inputs().iter().enumerate() {
        input_position[id.index()] = Some(position);
    }
    // Values are dropped as soon as their last user has run.
    let mut remaining_uses = graph.use_counts();
    let mut values: Vec<Option<Value>> = (0..graph.len()).map(|_| None).collect();

    for (index, node) in graph.nodes().iter().enumerate() {
        let dtype = node.ty.dtype;
        let shape = &sizes[index];
        let value = match &node.op {
            Op::Input { name } => {
                let position = input_position[index].ok_or_else(|| {
                    internal(format!("input node %{index} `{name}` is not a graph input"))
                })?;
                Value::from_tensor(&inputs[position])?
            }
            Op::Constant { value } => Value {
                dtype,
                shape: vec![],
                data: constant(dtype, *value),
            },
            Op::Iota { len, .. } => {
                let len = len.as_static().ok_or_else(|| {
                    RuntimeError::Unsupported(format!(
                        "%{index}: an arange of symbolic length {len}; the interpreter needs \
                         static shapes"
                    ))
                })?;
                Value {
                    dtype,
                    shape: vec![len],
                    data: iota(dtype, len),
                }
            }
            op => {
                let bytes = value_bytes(dtype, shape);
                if bytes >= PROBE_MIN_BYTES {
                    probe(bytes).map_err(|e| e.allocating(format!("%{index} ({})", op.name())))?;
                }
                let args = node
                    .inputs
                    .iter()
                    .map(|i| {
                        values[i.index()]
                            .as_ref()
                            .ok_or_else(|| internal(format!("operand {i} of %{index} is gone")))
                    })
                    .collect::<Result<Vec<&Value>, RuntimeError>>()?;
                let data = eval(op, dtype, shape, &args).map_err(|e| match e {
                    RuntimeError::Data(message) => {
                        RuntimeError::Data(format!("%{index} ({}): {message}", op.name()))
                    }
                    other => other,
                })?;
                Value {
                    dtype,
                    shape: shape.clone(),
                    data,
                }
            }
        };
        value.check(index)?;
        values[index] = Some(value);
        for operand in &node.inputs {
            let count = &mut remaining_uses[operand.index()];
            *count = count.saturating_sub(1);
            if *count == 0 {
                values[operand.index()] = None;
            }
        }
        if remaining_uses[index] == 0 {
            values[index] = None;
        }
    }

    graph
        .outputs()
        .iter()
        .map(|o| {
            values[o.index()]
                .as_ref()
                .ok_or_else(|| internal(format!("output {o} was not computed")))?
                .to_tensor()
        })
        .collect()
}

/// Results at least this large are probed (see [`interpret_within`]).
const PROBE_MIN_BYTES: usize = 1 << 20;

/// Asks the allocator for `bytes` bytes and frees them: `OutOfMemory` if it has none.
fn probe(bytes: usize) -> Result<(), RuntimeError> {
    let mut block: Vec<u8> = Vec::new();
    block
        .try_reserve_exact(bytes)
        .map_err(|_| RuntimeError::out_of_memory(bytes, "a value"))
}

/// Bytes of a value of `dtype` and `shape` as the interpreter holds it (floats as f64).
fn value_bytes(dtype: DType, shape: &[usize]) -> usize {
    let element = if dtype == DType::Bool { 1 } else { 8 };
    shape
        .iter()
        .fold(element, |acc: usize, &n| acc.saturating_mul(n))
}

/// Bytes of the values [`interpret`] holds at once, at most, for `graph` (static shapes): the
/// largest sum over the ops of the values alive when each runs, its result included, plus the
/// output tensors it returns. `None` for a graph with symbolic sizes.
pub fn interpreter_peak_bytes(graph: &Graph) -> Option<usize> {
    let sizes = static_sizes(graph).ok()?;
    Some(peak_bytes(graph, &sizes))
}

fn peak_bytes(graph: &Graph, sizes: &[Vec<usize>]) -> usize {
    let bytes: Vec<usize> = graph
        .nodes()
        .iter()
        .zip(sizes)
        .map(|(node, shape)| value_bytes(node.ty.dtype, shape))
        .collect();
    let mut remaining_uses = graph.use_counts();
    let mut live: usize = 0;
    let mut peak: usize = 0;
    for (index, node) in graph.nodes().iter().enumerate() {
        live = live.saturating_add(bytes[index]);
        peak = peak.max(live);
        for operand in &node.inputs {
            let count = &mut remaining_uses[operand.index()];
            if *count > 0 {
                *count -= 1;
                if *count == 0 {
                    live -= bytes[operand.index()];
                }
            }
        }
        if remaining_uses[index] == 0 {
            live -= bytes[index];
        }
    }
    let outputs = graph
        .outputs()
        .iter()
        .map(|o| {
            let ty = graph.ty(*o);
            sizes[o.index()]
                .iter()
                .fold(ty.dtype.size_bytes(), |acc: usize, &n| {
                    acc.saturating_mul(n)
                })
        })
        .fold(0usize, usize::saturating_add);
    peak.saturating_add(outputs)
}

// ---- values -------------------------------------------------------------------------------------

/// Contiguous row-major elements. Floats of every float dtype are held as f64, already rounded
/// to their dtype.
#[derive(Clone, Debug, PartialEq)]
enum Data {
    F(Vec<f64>),
    I(Vec<i64>),
    B(Vec<bool>),
}

impl Data {
    fn len(&self) -> usize {
        match self {
            Data::F(v) => v.len(),
            Data::I(v) => v.len(),
            Data::B(v) => v.len(),
        }
    }
}

#[derive(Clone, Debug)]
struct Value {
    dtype: DType,
    shape: Vec<usize>,
    data: Data,
}

fn internal(message: impl Into<String>) -> RuntimeError {
    RuntimeError::Unsupported(format!("interpreter invariant broken: {}", message.into()))
}

impl Value {
    fn from_tensor(t: &Tensor) -> Result<Value, RuntimeError> {
        let t = t.contiguous();
        let data = match t.dtype() {
            DType::F64 => Data::F(t.to_vec::<f64>()?),
            DType::F32 => Data::F(t.to_vec::<f32>()?.into_iter().map(f64::from).collect()),
            DType::F16 => Data::F(t.to_vec::<f16>()?.into_iter().map(f16::to_f64).collect()),
            DType::BF16 => Data::F(t.to_vec::<bf16>()?.into_iter().map(bf16::to_f64).collect()),
            DType::I64 => Data::I(t.to_vec::<i64>()?),
            // Read through `to_f64_vec`, which accepts any byte as a bool (non-zero = true).
            DType::Bool => Data::B(t.to_f64_vec().into_iter().map(|x| x != 0.0).collect()),
        };
        Ok(Value {
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            data,
        })
    }

    fn to_tensor(&self) -> Result<Tensor, RuntimeError> {
        let shape = &self.shape;
        match (&self.data, self.dtype) {
            (Data::F(x), DType::F64) => Tensor::from_vec(shape, x.clone()),
            (Data::F(x), DType::F32) => {
                Tensor::from_vec(shape, x.iter().map(|&v| v as f32).collect())
            }
            (Data::F(x), DType::F16) => {
                Tensor::from_vec(shape, x.iter().map(|&v| f16::from_f64(v)).collect())
            }
            (Data::F(x), DType::BF16) => {
                Tensor::from_vec(shape, x.iter().map(|&v| bf16::from_f64(v)).collect())
            }
            (Data::I(x), DType::I64) => Tensor::from_vec(shape, x.clone()),
            (Data::B(x), DType::Bool) => Tensor::from_vec(shape, x.clone()),
            _ => Err(internal(format!(
                "{} value holds the wrong kind of data",
                self.dtype
            ))),
        }
    }

    /// The data agrees with the dtype and the element count with the shape.
    fn check(&self, index: usize) -> Result<(), RuntimeError> {
        let kind_ok = match &self.data {
            Data::F(_) => self.dtype.is_float(),
            Data::I(_) => self.dtype == DType::I64,
            Data::B(_) => self.dtype == DType::Bool,
        };
        if !kind_ok || self.data.len() != self.numel() {
            return Err(internal(format!(
                "%{index}: computed data does not match type {}{:?}",
                self.dtype, self.shape
            )));
        }
        Ok(())
    }

    fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    fn floats(&self) -> Result<&[f64], RuntimeError> {
        match &self.data {
            Data::F(v) => Ok(v),
            _ => Err(internal(format!(
                "expected a float value, found {}",
                self.dtype
            ))),
        }
    }

    fn ints(&self) -> Result<&[i64], RuntimeError> {
        match &self.data {
            Data::I(v) => Ok(v),
            _ => Err(internal(format!(
                "expected an i64 value, found {}",
                self.dtype
            ))),
        }
    }

    fn bools(&self) -> Result<&[bool], RuntimeError> {
        match &self.data {
            Data::B(v) => Ok(v),
            _ => Err(internal(format!(
                "expected a bool value, found {}",
                self.dtype
            ))),
        }
    }
}

/// Every node's sizes; symbolic dims (and absurd element counts) are unsupported.
fn static_sizes(graph: &Graph) -> Result<Vec<Vec<usize>>, RuntimeError> {
    let max_numel = isize::MAX as usize / 8;
    graph
        .nodes()
        .iter()
        .enumerate()
        .map(|(index, node)| {
            let sizes = node.ty.static_sizes().ok_or_else(|| {
                RuntimeError::Unsupported(format!(
                    "%{index} has type {} with a symbolic dim; the interpreter needs static shapes",
                    node.ty
                ))
            })?;
            match sizes.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)) {
                Some(n) if n <= max_numel => Ok(sizes),
                _ => Err(RuntimeError::Unsupported(format!(
                    "%{index} of type {} is too large",
                    node.ty
                ))),
            }
        })
        .collect()
}

// ---- rounding and casts -------------------------------------------------------------------------

/// Rounds an f64 result to `dtype` once (no double rounding through f32).
fn round(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::F32 => x as f32 as f64,
        DType::F16 => f16::from_f64(x).to_f64(),
        DType::BF16 => bf16::from_f64(x).to_f64(),
        _ => x,
    }
}

fn constant(dtype: DType, value: f64) -> Data {
    match dtype {
        DType::I64 => Data::I(vec![value as i64]),
        DType::Bool => Data::B(vec![value != 0.0]),
        float => Data::F(vec![round(float, value)]),
    }
}

/// `v` converted to `to`: float→i64 truncates, anything→bool is `!= 0`, bool→number is 0/1.
fn cast(v: &Value, to: DType) -> Cow<'_, Value> {
    if v.dtype == to {
        return Cow::Borrowed(v);
    }
    let data = match (&v.data, to) {
        (Data::F(x), DType::I64) => Data::I(x.iter().map(|&e| e as i64).collect()),
        (Data::F(x), DType::Bool) => Data::B(x.iter().map(|&e| e != 0.0).collect()),
        (Data::F(x), float) => Data::F(x.iter().map(|&e| round(float, e)).collect()),
        (Data::I(x), DType::I64) => Data::I(x.clone()),
        (Data::I(x), DType::Bool) => Data::B(x.iter().map(|&e| e != 0).collect()),
        (Data::I(x), float) => Data::F(x.iter().map(|&e| round(float, e as f64)).collect()),
        (Data::B(x), DType::I64) => Data::I(x.iter().map(|&e| e as i64).collect()),
        (Data::B(x), DType::Bool) => Data::B(x.clone()),
        (Data::B(x), _float) => Data::F(x.iter().map(|&e| e as u8 as f64).collect()),
    };
    Cow::Owned(Value {
        dtype: to,
        shape: v.shape.clone(),
        data,
    })
}

// ---- index maps ---------------------------------------------------------------------------------

/// Element offsets `base + Σ index[d]·strides[d]` of every index of `shape`, in row-major order.
/// Zero strides broadcast; permuted or stepped strides give permutes and slices.
struct Offsets {
    shape: Vec<usize>,
    strides: Vec<usize>,
    index: Vec<usize>,
    offset: usize,
    remaining: usize,
}

impl Offsets {
    fn new(shape: &[usize], strides: &[usize], base: usize) -> Offsets {
        Offsets {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            index: vec![0; shape.len()],
            offset: base,
            remaining: shape.iter().product(),
        }
    }

    /// Offsets into a contiguous value of shape `from` for each index of the broadcast shape `to`.
    fn broadcast(from: &[usize], to: &[usize]) -> Offsets {
        Offsets::new(to, &broadcast_strides(from, to), 0)
    }
}

impl Iterator for Offsets {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.remaining == 0 {
            return None;
        }
        let current = self.offset;
        self.remaining -= 1;
        if self.remaining > 0 {
            for d in (0..self.shape.len()).rev() {
                self.index[d] += 1;
                self.offset += self.strides[d];
                if self.index[d] < self.shape[d] {
                    break;
                }
                self.offset -= self.strides[d] * self.shape[d];
                self.index[d] = 0;
            }
        }
        Some(current)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

/// Strides (in elements of a contiguous `from`) that read `from` broadcast NumPy-style to `to`:
/// missing leading dims and size-1 dims get stride 0.
fn broadcast_strides(from: &[usize], to: &[usize]) -> Vec<usize> {
    let own = contiguous_strides(from);
    let lead = to.len().saturating_sub(from.len());
    (0..to.len())
        .map(|i| {
            if i < lead || from[i - lead] == 1 {
                0
            } else {
                own[i - lead]
            }
        })
        .collect()
}

fn broadcast_sizes(a: &[usize], b: &[usize]) -> Vec<usize> {
    let rank = a.len().max(b.len());
    let get = |s: &[usize], i: usize| {
        if i + s.len() >= rank {
            s[i + s.len() - rank]
        } else {
            1
        }
    };
    (0..rank)
        .map(|i| if get(a, i) == 1 { get(b, i) } else { get(a, i) })
        .collect()
}

fn pick<T: Copy>(src: &[T], offsets: Offsets) -> Vec<T> {
    offsets.map(|o| src[o]).collect()
}

/// The elements of `v` at `offsets`, in order (any element type).
fn relayout(v: &Value, offsets: Offsets) -> Data {
    match &v.data {
        Data::F(x) => Data::F(pick(x, offsets)),
        Data::I(x) => Data::I(pick(x, offsets)),
        Data::B(x) => Data::B(pick(x, offsets)),
    }
}

/// `f(a[i], b[j])` for every index of `out`, with `a` and `b` broadcast to it.
fn zip_broadcast<A: Copy, B: Copy, R>(
    out: &[usize],
    (a, a_shape): (&[A], &[usize]),
    (b, b_shape): (&[B], &[usize]),
    f: impl Fn(A, B) -> R,
) -> Vec<R> {
    if a_shape == out && b_shape == out {
        return a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect();
    }
    Offsets::broadcast(a_shape, out)
        .zip(Offsets::broadcast(b_shape, out))
        .map(|(i, j)| f(a[i], b[j]))
        .collect()
}

/// `[0, 1, .., len - 1]` as `dtype`'s data (floats exactly, as f64 then rounded).
fn iota(dtype: DType, len: usize) -> Data {
    match dtype {
        DType::I64 => Data::I((0..len as i64).collect()),
        DType::Bool => Data::B((0..len).map(|i| i != 0).collect()),
        _ => Data::F((0..len).map(|i| round(dtype, i as f64)).collect()),
    }
}

// ---- dispatch -----------------------------------------------------------------------------------

/// The data of `op` applied to `args`; `dtype` and `shape` are the node's (verified) type.
fn eval(op: &Op, dtype: DType, shape: &[usize], args: &[&Value]) -> Result<Data, RuntimeError> {
    let x = args[0];
    match op {
        Op::Input { .. } | Op::Constant { .. } | Op::Iota { .. } => {
            Err(internal("sources are not evaluated by `eval`"))
        }
        Op::Unary(u) => unary(*u, x),
        Op::Binary(b) => binary(*b, dtype, shape, x, args[1]),
        Op::Compare(c) => compare(*c, shape, x, args[1]),
        Op::Where => select(dtype, shape, x, args[1], args[2]),
        Op::Cast { dtype } => Ok(cast(x, *dtype).into_owned().data),
        Op::Reduce { op, axes, .. } => reduce(*op, x, axes),
        Op::Mean { axes, .. } => moments(x, axes, None),
        Op::Var {
            axes, correction, ..
        } => moments(x, axes, Some(*correction)),
        Op::Reshape { .. } => Ok(x.data.clone()),
        Op::Permute { perm } => {
            let own = contiguous_strides(&x.shape);
            let strides: Vec<usize> = perm.iter().map(|&p| own[p]).collect();
            Ok(relayout(x, Offsets::new(shape, &strides, 0)))
        }
        Op::Expand { .. } => Ok(relayout(x, Offsets::broadcast(&x.shape, shape))),
        Op::Slice {
            dim,
            start,
            step,
            from,
            ..
        } => {
            let mut strides = contiguous_strides(&x.shape);
            // The type rule checked `start <= size` for a slice from the end of a static dim.
            let first = if *from == SliceFrom::End {
                x.shape[*dim] - start
            } else {
                *start
            };
            let base = first * strides[*dim];
            strides[*dim] *= step;
            Ok(relayout(x, Offsets::new(shape, &strides, base)))
        }
        Op::Cat { dim } => cat(*dim, shape, args),
        Op::Gather => gather(x, args[1]),
        Op::TakeAlong { dim } => take_along(x, args[1], *dim, shape),
        Op::ScatterAdd { dim, .. } => scatter_add(x, args[1], *dim, shape),
        Op::Detach => Ok(x.data.clone()),
        Op::CumSum { dim } => cumsum(x, *dim),
        Op::Im2col { window } => im2col(x, window),
        Op::Grad { .. } => Err(RuntimeError::Unsupported(
            "grad nodes must be expanded by passes::autodiff before interpretation".into(),
        )),
        Op::Matmul => matmul(dtype, x, args[1]),
        Op::Linear { has_bias } => linear(
            dtype,
            x,
            args[1],
            if *has_bias { Some(args[2]) } else { None },
        ),
        Op::Relu => Ok(map_floats(
            x,
            |v| if v.is_nan() || v > 0.0 { v } else { 0.0 },
        )),
        Op::Reciprocal => Ok(map_floats(x, |v| 1.0 / v)),
        Op::Silu => Ok(map_floats(x, |v| v / (1.0 + (-v).exp()))),
        Op::Gelu { tanh: false } => Ok(map_floats(x, |v| {
            0.5 * v * (1.0 + libm::erf(v / std::f64::consts::SQRT_2))
        })),
        Op::Gelu { tanh: true } => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            Ok(map_floats(x, |v| {
                0.5 * v * (1.0 + (k * (v + 0.044715 * v * v * v)).tanh())
            }))
        }
        Op::Clamp { min, max } => Ok(map_floats(x, |v| {
            // NaN compares false both ways and so stays NaN; min > max gives max, as in torch.
            let mut y = v;
            if let Some(lo) = *min {
                if y < lo {
                    y = lo;
                }
            }
            if let Some(hi) = *max {
                if y > hi {
                    y = hi;
                }
            }
            y
        })),
        Op::Softmax { dim } => softmax(x, *dim, false),
        Op::LogSoftmax { dim } => softmax(x, *dim, true),
        Op::LayerNorm {
            normalized_rank,
            eps,
            has_weight,
            has_bias,
        } => {
            let mut params = args[1..].iter().copied();
            let weight = if *has_weight { params.next() } else { None };
            let bias = if *has_bias { params.next() } else { None };
            layer_norm(x, weight, bias, *normalized_rank, *eps)
        }
    }
}

// ---- pointwise ----------------------------------------------------------------------------------

/// A float composite computed in f64 and rounded once to the value's dtype.
fn map_floats(x: &Value, f: impl Fn(f64) -> f64) -> Data {
    match &x.data {
        Data::F(v) => Data::F(v.iter().map(|&e| round(x.dtype, f(e))).collect()),
        other => other.clone(), // unreachable for verified graphs: these ops need float input
    }
}

fn unary(op: UnaryOp, x: &Value) -> Result<Data, RuntimeError> {
    if let Data::I(v) = &x.data {
        return match op {
            UnaryOp::Neg => Ok(Data::I(v.iter().map(|e| e.wrapping_neg()).collect())),
            UnaryOp::Abs => Ok(Data::I(v.iter().map(|e| e.wrapping_abs()).collect())),
            _ => Err(internal(format!("{op:?} of an i64 value"))),
        };
    }
    let dtype = x.dtype;
    let v = x.floats()?;
    let map = |f: fn(f64) -> f64| Data::F(v.iter().map(|&e| round(dtype, f(e))).collect());
    Ok(match op {
        UnaryOp::Neg => map(|e| -e),
        UnaryOp::Abs => map(f64::abs),
        UnaryOp::Exp => map(f64::exp),
        UnaryOp::Log => map(f64::ln),
        UnaryOp::Sqrt => map(f64::sqrt),
        UnaryOp::Rsqrt => map(|e| 1.0 / e.sqrt()),
        UnaryOp::Sin => map(f64::sin),
        UnaryOp::Cos => map(f64::cos),
        UnaryOp::Tanh => map(f64::tanh),
        UnaryOp::Erf => map(libm::erf),
        UnaryOp::Sigmoid => map(|e| 1.0 / (1.0 + (-e).exp())),
    })
}

fn binary_float(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Maximum => nan_propagating(f64::max)(a, b),
        BinaryOp::Minimum => nan_propagating(f64::min)(a, b),
        BinaryOp::Pow => a.powf(b),
    }
}

fn binary_int(op: BinaryOp, a: i64, b: i64) -> i64 {
    match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Maximum => a.max(b),
        BinaryOp::Minimum => a.min(b),
        // Type rules reject integer Div/Pow; keep the interpreter total anyway.
        BinaryOp::Div => a.checked_div(b).unwrap_or(0),
        BinaryOp::Pow => u32::try_from(b).map(|e| a.wrapping_pow(e)).unwrap_or(0),
    }
}

fn binary(
    op: BinaryOp,
    dtype: DType,
    shape: &[usize],
    a: &Value,
    b: &Value,
) -> Result<Data, RuntimeError> {
    let (a, b) = (cast(a, dtype), cast(b, dtype));
    Ok(match (&a.data, &b.data) {
        (Data::F(x), Data::F(y)) => Data::F(zip_broadcast(
            shape,
            (x, &a.shape),
            (y, &b.shape),
            |p, q| round(dtype, binary_float(op, p, q)),
        )),
        (Data::I(x), Data::I(y)) => Data::I(zip_broadcast(
            shape,
            (x, &a.shape),
            (y, &b.shape),
            |p, q| binary_int(op, p, q),
        )),
        _ => return Err(internal(format!("{op:?} in dtype {dtype}"))),
    })
}

fn compare_values<T: PartialOrd>(op: CompareOp, a: T, b: T) -> bool {
    match op {
        CompareOp::Eq => a == b,
        CompareOp::Ne => a != b,
        CompareOp::Lt => a < b,
        CompareOp::Le => a <= b,
        CompareOp::Gt => a > b,
        CompareOp::Ge => a >= b,
    }
}

fn compare(op: CompareOp, shape: &[usize], a: &Value, b: &Value) -> Result<Data, RuntimeError> {
    let common = DType::promote(a.dtype, b.dtype);
    let (a, b) = (cast(a, common), cast(b, common));
    let (sa, sb) = (&a.shape[..], &b.shape[..]);
    let f = |p, q| compare_values(op, p, q);
    Ok(Data::B(match (&a.data, &b.data) {
        (Data::F(x), Data::F(y)) => zip_broadcast(shape, (x, sa), (y, sb), f),
        (Data::I(x), Data::I(y)) => {
            zip_broadcast(shape, (x, sa), (y, sb), |p, q| compare_values(op, p, q))
        }
        (Data::B(x), Data::B(y)) => {
            zip_broadcast(shape, (x, sa), (y, sb), |p, q| compare_values(op, p, q))
        }
        _ => return Err(internal(format!("comparison in dtype {common}"))),
    }))
}

fn select_typed<T: Copy>(
    shape: &[usize],
    cond: (&[bool], &[usize]),
    a: (&[T], &[usize]),
    b: (&[T], &[usize]),
) -> Vec<T> {
    let (ic, ia, ib) = (
        Offsets::broadcast(cond.1, shape),
        Offsets::broadcast(a.1, shape),
        Offsets::broadcast(b.1, shape),
    );
    ic.zip(ia)
        .zip(ib)
        .map(|((c, i), j)| if cond.0[c] { a.0[i] } else { b.0[j] })
        .collect()
}

fn select(
    dtype: DType,
    shape: &[usize],
    cond: &Value,
    a: &Value,
    b: &Value,
) -> Result<Data, RuntimeError> {
    let c = (cond.bools()?, &cond.shape[..]);
    let (a, b) = (cast(a, dtype), cast(b, dtype));
    let (sa, sb) = (&a.shape[..], &b.shape[..]);
    Ok(match (&a.data, &b.data) {
        (Data::F(x), Data::F(y)) => Data::F(select_typed(shape, c, (x, sa), (y, sb))),
        (Data::I(x), Data::I(y)) => Data::I(select_typed(shape, c, (x, sa), (y, sb))),
        (Data::B(x), Data::B(y)) => Data::B(select_typed(shape, c, (x, sa), (y, sb))),
        _ => return Err(internal(format!("where in dtype {dtype}"))),
    })
}

// ---- reductions ---------------------------------------------------------------------------------

/// Offsets of `shape` with the reduced `axes` moved last, so each output element's inputs are
/// `count` consecutive offsets; also the number of outputs (`outer`) and `count`.
fn lanes(shape: &[usize], axes: &[usize]) -> (Offsets, usize, usize) {
    let own = contiguous_strides(shape);
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !axes.contains(d)).collect();
    let order: Vec<usize> = kept.iter().chain(axes).copied().collect();
    let sizes: Vec<usize> = order.iter().map(|&d| shape[d]).collect();
    let strides: Vec<usize> = order.iter().map(|&d| own[d]).collect();
    let outer = kept.iter().map(|&d| shape[d]).product();
    let count = axes.iter().map(|&d| shape[d]).product();
    (Offsets::new(&sizes, &strides, 0), outer, count)
}

/// Running sums along `dim`: floats accumulated in f64, each rounded to the dtype; i64 wrapping.
fn cumsum(x: &Value, dim: usize) -> Result<Data, RuntimeError> {
    if let Data::I(v) = &x.data {
        let strides = contiguous_strides(&x.shape);
        let (n, stride) = (x.shape[dim], strides[dim]);
        let mut out = v.clone();
        for start in 0..v.len() {
            if n == 0 || (start / stride) % n != 0 {
                continue;
            }
            let mut acc = 0i64;
            for k in 0..n {
                let i = start + k * stride;
                acc = acc.wrapping_add(v[i]);
                out[i] = acc;
            }
        }
        return Ok(Data::I(out));
    }
    let v = x.floats()?;
    let strides = contiguous_strides(&x.shape);
    let (n, stride) = (x.shape[dim], strides[dim]);
    let mut out = v.to_vec();
    for start in 0..v.len() {
        // Each line starts where its index along `dim` is 0.
        if n == 0 || (start / stride) % n != 0 {
            continue;
        }
        let mut acc = 0.0;
        for k in 0..n {
            let i = start + k * stride;
            acc += v[i];
            out[i] = round(x.dtype, acc);
        }
    }
    Ok(Data::F(out))
}

/// `F.unfold`: see `Op::Im2col` (zeros where the window reads outside `x`).
fn im2col(x: &Value, window: &minductor_ir::Window2d) -> Result<Data, RuntimeError> {
    let v = x.floats()?;
    let [n, c, h, w] = x.shape[..] else {
        return Err(internal(format!("im2col of shape {:?}", x.shape)));
    };
    let [oh, ow] = window
        .output_size(h, w)
        .ok_or_else(|| internal(format!("im2col window {window} on {:?}", x.shape)))?;
    let [kh, kw] = window.kernel;
    let mut out = Vec::with_capacity(n * c * kh * kw * oh * ow);
    for image in 0..n {
        for channel in 0..c {
            let plane = &v[(image * c + channel) * h * w..][..h * w];
            for i in 0..kh {
                for j in 0..kw {
                    for y in 0..oh {
                        let row = (y * window.stride[0] + i * window.dilation[0])
                            .checked_sub(window.padding[0])
                            .filter(|&r| r < h);
                        for z in 0..ow {
                            let col = (z * window.stride[1] + j * window.dilation[1])
                                .checked_sub(window.padding[1])
                                .filter(|&q| q < w);
                            out.push(match (row, col) {
                                (Some(r), Some(q)) => plane[r * w + q],
                                _ => 0.0,
                            });
                        }
                    }
                }
            }
        }
    }
    Ok(Data::F(out))
}

fn nan_propagating(pick: fn(f64, f64) -> f64) -> impl Fn(f64, f64) -> f64 {
    move |m, e| {
        if m.is_nan() || e.is_nan() {
            f64::NAN
        } else {
            pick(m, e)
        }
    }
}

fn reduce(op: ReduceOp, x: &Value, axes: &[usize]) -> Result<Data, RuntimeError> {
    let (mut offsets, outer, count) = lanes(&x.shape, axes);
    Ok(match &x.data {
        Data::F(v) => {
            let mut out = Vec::with_capacity(outer);
            for _ in 0..outer {
                let lane = offsets.by_ref().take(count).map(|o| v[o]);
                out.push(match op {
                    // Accumulate in f64, round once.
                    ReduceOp::Sum => round(x.dtype, lane.sum()),
                    ReduceOp::Max => lane.fold(f64::NEG_INFINITY, nan_propagating(f64::max)),
                    ReduceOp::Min => lane.fold(f64::INFINITY, nan_propagating(f64::min)),
                });
            }
            Data::F(out)
        }
        Data::I(v) => {
            let mut out = Vec::with_capacity(outer);
            for _ in 0..outer {
                let lane = offsets.by_ref().take(count).map(|o| v[o]);
                out.push(match op {
                    ReduceOp::Sum => lane.fold(0i64, i64::wrapping_add),
                    ReduceOp::Max => lane.fold(i64::MIN, i64::max),
                    ReduceOp::Min => lane.fold(i64::MAX, i64::min),
                });
            }
            Data::I(out)
        }
        Data::B(_) => return Err(internal("reduction of a bool value")),
    })
}

/// Mean (`correction == None`) or variance `Σ(x-mean)²/(count-correction)`, in f64.
fn moments(x: &Value, axes: &[usize], correction: Option<usize>) -> Result<Data, RuntimeError> {
    let v = x.floats()?;
    let (mut offsets, outer, count) = lanes(&x.shape, axes);
    let mut lane = Vec::with_capacity(count);
    let mut out = Vec::with_capacity(outer);
    for _ in 0..outer {
        lane.clear();
        lane.extend(offsets.by_ref().take(count).map(|o| v[o]));
        let mean = lane.iter().sum::<f64>() / count as f64;
        let result = match correction {
            None => mean,
            Some(c) => {
                let divisor = (count as f64 - c as f64).max(0.0);
                lane.iter().map(|e| (e - mean) * (e - mean)).sum::<f64>() / divisor
            }
        };
        out.push(round(x.dtype, result));
    }
    Ok(Data::F(out))
}

fn softmax(x: &Value, dim: usize, log: bool) -> Result<Data, RuntimeError> {
    let v = x.floats()?;
    let n = x.shape[dim];
    let inner: usize = x.shape[dim + 1..].iter().product();
    let outer: usize = x.shape[..dim].iter().product();
    let mut out = vec![0f64; v.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| o * n * inner + k * inner + i;
            let max = (0..n).map(|k| v[at(k)]).fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = (0..n).map(|k| (v[at(k)] - max).exp()).sum();
            for k in 0..n {
                let shifted = v[at(k)] - max;
                let y = if log {
                    shifted - sum.ln()
                } else {
                    shifted.exp() / sum
                };
                out[at(k)] = round(x.dtype, y);
            }
        }
    }
    Ok(Data::F(out))
}

fn layer_norm(
    x: &Value,
    weight: Option<&Value>,
    bias: Option<&Value>,
    normalized_rank: usize,
    eps: f64,
) -> Result<Data, RuntimeError> {
    let v = x.floats()?;
    let weight = weight.map(Value::floats).transpose()?;
    let bias = bias.map(Value::floats).transpose()?;
    let m: usize = x.shape[x.shape.len() - normalized_rank..].iter().product();
    let mut out = vec![0f64; v.len()];
    if m == 0 {
        return Ok(Data::F(out));
    }
    for (row, dst) in v.chunks_exact(m).zip(out.chunks_exact_mut(m)) {
        let mean = row.iter().sum::<f64>() / m as f64;
        let var = row.iter().map(|&e| (e - mean) * (e - mean)).sum::<f64>() / m as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        for (j, (&e, d)) in row.iter().zip(dst.iter_mut()).enumerate() {
            let mut y = (e - mean) * rstd;
            if let Some(w) = weight {
                y *= w[j];
            }
            if let Some(b) = bias {
                y += b[j];
            }
            *d = round(x.dtype, y);
        }
    }
    Ok(Data::F(out))
}

// ---- data movement ------------------------------------------------------------------------------

fn cat_typed<'a, T: Copy + 'a>(
    dim: usize,
    outer: usize,
    args: &[&'a Value],
    get: impl Fn(&'a Value) -> Result<&'a [T], RuntimeError>,
) -> Result<Vec<T>, RuntimeError> {
    let parts = args
        .iter()
        .map(|a| Ok((get(a)?, a.shape[dim..].iter().product::<usize>())))
        .collect::<Result<Vec<(&[T], usize)>, RuntimeError>>()?;
    let mut out = Vec::with_capacity(parts.iter().map(|(d, _)| d.len()).sum());
    for o in 0..outer {
        for (data, chunk) in &parts {
            out.extend_from_slice(&data[o * chunk..(o + 1) * chunk]);
        }
    }
    Ok(out)
}

fn cat(dim: usize, shape: &[usize], args: &[&Value]) -> Result<Data, RuntimeError> {
    let outer = shape[..dim].iter().product();
    Ok(match &args[0].data {
        Data::F(_) => Data::F(cat_typed(dim, outer, args, Value::floats)?),
        Data::I(_) => Data::I(cat_typed(dim, outer, args, Value::ints)?),
        Data::B(_) => Data::B(cat_typed(dim, outer, args, Value::bools)?),
    })
}

fn gather_typed<T: Copy>(
    table: &[T],
    rows: usize,
    indices: &[i64],
) -> Result<Vec<T>, RuntimeError> {
    let row_len = table.len().checked_div(rows).unwrap_or(0);
    let mut out = Vec::with_capacity(indices.len() * row_len);
    for &index in indices {
        let row = usize::try_from(index)
            .ok()
            .filter(|&r| r < rows)
            .ok_or_else(|| {
                RuntimeError::Data(format!(
                    "index {index} is out of range for a table of {rows} rows"
                ))
            })?;
        out.extend_from_slice(&table[row * row_len..(row + 1) * row_len]);
    }
    Ok(out)
}

fn gather(table: &Value, indices: &Value) -> Result<Data, RuntimeError> {
    let rows = table.shape[0];
    let indices = indices.ints()?;
    Ok(match &table.data {
        Data::F(t) => Data::F(gather_typed(t, rows, indices)?),
        Data::I(t) => Data::I(gather_typed(t, rows, indices)?),
        Data::B(t) => Data::B(gather_typed(t, rows, indices)?),
    })
}

/// Position along `dim` named by `index`, or the out-of-range error eager gives.
fn checked_position(index: i64, size: usize, dim: usize) -> Result<usize, RuntimeError> {
    usize::try_from(index)
        .ok()
        .filter(|&i| i < size)
        .ok_or_else(|| {
            RuntimeError::Data(format!(
                "index {index} is out of range for dim {dim} of size {size}"
            ))
        })
}

/// `torch.gather(x, dim, index)`: `out[p] = x[p with p[dim] = index[p]]`.
fn take_along(x: &Value, index: &Value, dim: usize, shape: &[usize]) -> Result<Data, RuntimeError> {
    let indices = index.ints()?;
    let strides = contiguous_strides(&x.shape);
    let mut offsets = Vec::with_capacity(indices.len());
    let mut position = vec![0usize; shape.len()];
    for &i in indices {
        let mut offset = 0;
        for d in 0..shape.len() {
            let p = if d == dim {
                checked_position(i, x.shape[dim], dim)?
            } else {
                position[d]
            };
            offset += p * strides[d];
        }
        offsets.push(offset);
        for d in (0..shape.len()).rev() {
            position[d] += 1;
            if position[d] < shape[d] {
                break;
            }
            position[d] = 0;
        }
    }
    Ok(match &x.data {
        Data::F(v) => Data::F(offsets.iter().map(|&o| v[o]).collect()),
        Data::I(v) => Data::I(offsets.iter().map(|&o| v[o]).collect()),
        Data::B(v) => Data::B(offsets.iter().map(|&o| v[o]).collect()),
    })
}

/// `zeros(shape).scatter_add(dim, index, src)` with `index` broadcast to `src`'s shape; sums are
/// accumulated in f64 and rounded once.
fn scatter_add(
    index: &Value,
    src: &Value,
    dim: usize,
    shape: &[usize],
) -> Result<Data, RuntimeError> {
    let values = src.floats()?;
    let indices: Vec<i64> = Offsets::broadcast(&index.shape, &src.shape)
        .map(|o| index.ints().map(|v| v[o]))
        .collect::<Result<_, _>>()?;
    let out_strides = contiguous_strides(shape);
    let mut sums = vec![0f64; shape.iter().product()];
    let mut position = vec![0usize; src.shape.len()];
    for (&v, &i) in values.iter().zip(&indices) {
        let mut offset = 0;
        for d in 0..shape.len() {
            let p = if d == dim {
                checked_position(i, shape[dim], dim)?
            } else {
                position[d]
            };
            offset += p * out_strides[d];
        }
        sums[offset] += v;
        for d in (0..position.len()).rev() {
            position[d] += 1;
            if position[d] < src.shape[d] {
                break;
            }
            position[d] = 0;
        }
    }
    Ok(Data::F(
        sums.into_iter().map(|s| round(src.dtype, s)).collect(),
    ))
}

// ---- matrix products ----------------------------------------------------------------------------

/// `C = A·B + beta·C` for an `m×k` A and `k×n` B given by element strides, and a contiguous `m×n` C,
/// in f64.
#[allow(clippy::too_many_arguments)]
fn gemm(
    (m, k, n): (usize, usize, usize),
    (a, rsa, csa): (&[f64], usize, usize),
    (b, rsb, csb): (&[f64], usize, usize),
    beta: f64,
    c: &mut [f64],
) -> Result<(), RuntimeError> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        c.iter_mut().for_each(|e| *e *= beta);
        return Ok(());
    }
    let last = |rows: usize, cols: usize, rs: usize, cs: usize| (rows - 1) * rs + (cols - 1) * cs;
    if last(m, k, rsa, csa) >= a.len() || last(k, n, rsb, csb) >= b.len() || m * n > c.len() {
        return Err(internal("gemm operands out of bounds"));
    }
    // SAFETY: every element dgemm reads or writes lies within `a`, `b` and `c` (checked above);
    // `c` is a unique borrow that does not alias `a` or `b`.
    unsafe {
        matrixmultiply::dgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            rsa as isize,
            csa as isize,
            b.as_ptr(),
            rsb as isize,
            csb as isize,
            beta,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
    Ok(())
}

/// `torch.matmul`: rank-1 operands get a 1 prepended (left) or appended (right), which the
/// node's shape then drops; batch dims broadcast. Computed in f64, rounded to `dtype` at the end.
fn matmul(dtype: DType, a: &Value, b: &Value) -> Result<Data, RuntimeError> {
    let (x, y) = (a.floats()?, b.floats()?);
    let mut sa = a.shape.clone();
    if sa.len() == 1 {
        sa.insert(0, 1);
    }
    let mut sb = b.shape.clone();
    if sb.len() == 1 {
        sb.push(1);
    }
    let (ra, rb) = (sa.len(), sb.len());
    let (m, k, n) = (sa[ra - 2], sa[ra - 1], sb[rb - 1]);
    let (batch_a, batch_b) = (&sa[..ra - 2], &sb[..rb - 2]);
    let batch = broadcast_sizes(batch_a, batch_b);
    let batches: usize = batch.iter().product();
    let mut out = vec![0f64; batches * m * n];
    let matrices = Offsets::broadcast(batch_a, &batch).zip(Offsets::broadcast(batch_b, &batch));
    for (i, (ia, ib)) in matrices.enumerate() {
        gemm(
            (m, k, n),
            (&x[ia * m * k..(ia + 1) * m * k], k, 1),
            (&y[ib * k * n..(ib + 1) * k * n], n, 1),
            0.0,
            &mut out[i * m * n..(i + 1) * m * n],
        )?;
    }
    out.iter_mut().for_each(|e| *e = round(dtype, *e));
    Ok(Data::F(out))
}

/// `x @ w^T (+ b)` with `x: [..., in]`, `w: [out, in]`, `b: [out]`; the bias is added inside the
/// f64 product (as addmm does) and the result rounded to `dtype` once.
fn linear(dtype: DType, x: &Value, w: &Value, bias: Option<&Value>) -> Result<Data, RuntimeError> {
    let (xs, ws) = (x.floats()?, w.floats()?);
    let (features_out, features_in) = (w.shape[0], w.shape[1]);
    let rows = x.shape[..x.shape.len() - 1].iter().product();
    let mut out = vec![0f64; rows * features_out];
    let beta = match bias {
        Some(b) => {
            let b = b.floats()?;
            for row in out.chunks_exact_mut(features_out.max(1)) {
                row.copy_from_slice(&b[..row.len()]);
            }
            1.0
        }
        None => 0.0,
    };
    gemm(
        (rows, features_in, features_out),
        (xs, features_in, 1),
        (ws, 1, features_in),
        beta,
        &mut out,
    )?;
    out.iter_mut().for_each(|e| *e = round(dtype, *e));
    Ok(Data::F(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use minductor_ir::{static_shape, NodeId, TensorType};

    fn ty(dtype: DType, shape: &[usize]) -> TensorType {
        TensorType::new(dtype, static_shape(shape))
    }

    fn f32s(t: &Tensor) -> Vec<f32> {
        t.to_vec::<f32>().unwrap()
    }

    fn assert_close(found: &[f32], expected: &[f32], tol: f32) {
        assert_eq!(found.len(), expected.len(), "{found:?} vs {expected:?}");
        for (i, (f, e)) in found.iter().zip(expected).enumerate() {
            assert!(
                (f - e).abs() <= tol,
                "element {i}: {f} vs {e} (all: {found:?})"
            );
        }
    }

    /// A graph with the given inputs and one op applied to all of them, returned as its output.
    fn one_op(inputs: &[TensorType], op: Op) -> Graph {
        let mut g = Graph::new();
        let ids: Vec<NodeId> = inputs
            .iter()
            .enumerate()
            .map(|(i, t)| g.input(format!("x{i}"), t.clone()))
            .collect();
        let out = g.add(op, &ids).unwrap();
        g.set_outputs(vec![out]);
        g.verify().unwrap();
        g
    }

    #[test]
    fn broadcasting_add() {
        let g = one_op(
            &[ty(DType::F32, &[2, 3]), ty(DType::F32, &[3])],
            Op::Binary(BinaryOp::Add),
        );
        let a = Tensor::from_vec(&[2, 3], vec![1f32, 2., 3., 4., 5., 6.]).unwrap();
        let b = Tensor::from_vec(&[3], vec![10f32, 20., 30.]).unwrap();
        let out = interpret(&g, &[a, b]).unwrap();
        assert_eq!(out[0].shape(), &[2, 3]);
        assert_eq!(f32s(&out[0]), vec![11., 22., 33., 14., 25., 36.]);

        // Both operands broadcast: [2, 1] + [1, 3] -> [2, 3], with an i64 operand promoted.
        let g = one_op(
            &[ty(DType::F32, &[2, 1]), ty(DType::I64, &[1, 3])],
            Op::Binary(BinaryOp::Add),
        );
        let a = Tensor::from_vec(&[2, 1], vec![0.5f32, 1.5]).unwrap();
        let b = Tensor::from_vec(&[1, 3], vec![1i64, 2, 3]).unwrap();
        let out = interpret(&g, &[a, b]).unwrap();
        assert_eq!(out[0].dtype(), DType::F32);
        assert_eq!(f32s(&out[0]), vec![1.5, 2.5, 3.5, 2.5, 3.5, 4.5]);
    }

    #[test]
    fn non_contiguous_input_and_constant() {
        let mut g = Graph::new();
        let x = g.input("x", ty(DType::F32, &[3, 2]));
        let two = g.constant(2.0, DType::F32);
        let y = g.add(Op::Binary(BinaryOp::Mul), &[x, two]).unwrap();
        g.set_outputs(vec![y]);
        let base = Tensor::from_vec(&[2, 3], vec![1f32, 2., 3., 4., 5., 6.]).unwrap();
        let view = base.permute(&[1, 0]).unwrap();
        assert!(!view.is_contiguous());
        let out = interpret(&g, &[view]).unwrap();
        assert!(out[0].is_contiguous());
        assert_eq!(f32s(&out[0]), vec![2., 8., 4., 10., 6., 12.]);
    }

    #[test]
    fn softmax_rows_sum_to_one_and_large_logits_are_stable() {
        let g = one_op(&[ty(DType::F32, &[2, 3])], Op::Softmax { dim: 1 });
        let x = Tensor::from_vec(&[2, 3], vec![1f32, 2., 3., 1000., 1001., 1002.]).unwrap();
        let out = f32s(&interpret(&g, &[x]).unwrap()[0]);
        // softmax([0, 1, 2]) = e^k / (1 + e + e²)
        let expected = [0.09003057f32, 0.24472847, 0.66524096];
        assert_close(&out[..3], &expected, 1e-6);
        assert_close(&out[3..], &expected, 1e-6);
        for row in out.chunks(3) {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        }

        let g = one_op(&[ty(DType::F32, &[3])], Op::LogSoftmax { dim: 0 });
        let x = Tensor::from_vec(&[3], vec![1000f32, 1001., 1002.]).unwrap();
        let out = f32s(&interpret(&g, &[x]).unwrap()[0]);
        assert_close(&out, &[-2.407_606, -1.407_606, -0.407_606], 1e-5);
    }

    #[test]
    fn softmax_over_a_middle_dim() {
        let g = one_op(&[ty(DType::F32, &[1, 2, 2])], Op::Softmax { dim: 1 });
        let x = Tensor::from_vec(&[1, 2, 2], vec![0f32, 5., 0., 5.]).unwrap();
        let out = f32s(&interpret(&g, &[x]).unwrap()[0]);
        assert_close(&out, &[0.5, 0.5, 0.5, 0.5], 1e-7);
    }

    #[test]
    fn layer_norm_small() {
        let op = Op::LayerNorm {
            normalized_rank: 1,
            eps: 1e-5,
            has_weight: true,
            has_bias: true,
        };
        let g = one_op(
            &[
                ty(DType::F32, &[2, 4]),
                ty(DType::F32, &[4]),
                ty(DType::F32, &[4]),
            ],
            op,
        );
        let x = Tensor::from_vec(&[2, 4], vec![1f32, 2., 3., 4., 2., 2., 2., 2.]).unwrap();
        let w = Tensor::from_vec(&[4], vec![1f32, 2., 1., 1.]).unwrap();
        let b = Tensor::from_vec(&[4], vec![0f32, 0., 1., 0.]).unwrap();
        let out = f32s(&interpret(&g, &[x, w, b]).unwrap()[0]);
        // Row 0: mean 2.5, population variance 1.25, 1/sqrt(1.25 + 1e-5) = 0.8944236.
        // Row 1 is constant: it normalises to 0, leaving the bias.
        let r = 0.8944236f32;
        let expected = [
            -1.5 * r,
            -0.5 * r * 2.0,
            0.5 * r + 1.0,
            1.5 * r,
            0.,
            0.,
            1.,
            0.,
        ];
        assert_close(&out, &expected, 1e-5);
    }

    #[test]
    fn matmul_2x3_by_3x2() {
        let g = one_op(
            &[ty(DType::F32, &[2, 3]), ty(DType::F32, &[3, 2])],
            Op::Matmul,
        );
        let a = Tensor::from_vec(&[2, 3], vec![1f32, 2., 3., 4., 5., 6.]).unwrap();
        let b = Tensor::from_vec(&[3, 2], vec![7f32, 8., 9., 10., 11., 12.]).unwrap();
        let out = interpret(&g, &[a, b]).unwrap();
        assert_eq!(out[0].shape(), &[2, 2]);
        assert_eq!(f32s(&out[0]), vec![58., 64., 139., 154.]);
    }

    #[test]
    fn matmul_batched_broadcast_and_vectors() {
        // a: [2, 1, 2, 2] holds I and 2I; b: [3, 2, 2] holds three matrices -> [2, 3, 2, 2].
        let g = one_op(
            &[ty(DType::F32, &[2, 1, 2, 2]), ty(DType::F32, &[3, 2, 2])],
            Op::Matmul,
        );
        let a = Tensor::from_vec(&[2, 1, 2, 2], vec![1f32, 0., 0., 1., 2., 0., 0., 2.]).unwrap();
        let bv: Vec<f32> = (1..=12).map(|v| v as f32).collect();
        let b = Tensor::from_vec(&[3, 2, 2], bv.clone()).unwrap();
        let out = interpret(&g, &[a, b.clone()]).unwrap();
        assert_eq!(out[0].shape(), &[2, 3, 2, 2]);
        let expected: Vec<f32> = bv
            .iter()
            .copied()
            .chain(bv.iter().map(|v| 2.0 * v))
            .collect();
        assert_eq!(f32s(&out[0]), expected);

        // Vector @ batched matrix: [2] @ [3, 2, 2] -> [3, 2], the column sums of each matrix.
        let g = one_op(
            &[ty(DType::F32, &[2]), ty(DType::F32, &[3, 2, 2])],
            Op::Matmul,
        );
        let v = Tensor::from_vec(&[2], vec![1f32, 1.]).unwrap();
        let out = interpret(&g, &[v, b.clone()]).unwrap();
        assert_eq!(out[0].shape(), &[3, 2]);
        assert_eq!(f32s(&out[0]), vec![4., 6., 12., 14., 20., 22.]);

        // Batched matrix @ vector: [3, 2, 2] @ [2] -> [3, 2], the row sums.
        let g = one_op(
            &[ty(DType::F32, &[3, 2, 2]), ty(DType::F32, &[2])],
            Op::Matmul,
        );
        let v = Tensor::from_vec(&[2], vec![1f32, 1.]).unwrap();
        let out = interpret(&g, &[b, v]).unwrap();
        assert_eq!(f32s(&out[0]), vec![3., 7., 11., 15., 19., 23.]);
    }

    #[test]
    fn linear_with_bias() {
        let op = Op::Linear { has_bias: true };
        let g = one_op(
            &[
                ty(DType::F32, &[2, 3]),
                ty(DType::F32, &[2, 3]),
                ty(DType::F32, &[2]),
            ],
            op,
        );
        let x = Tensor::from_vec(&[2, 3], vec![1f32, 2., 3., 4., 5., 6.]).unwrap();
        let w = Tensor::from_vec(&[2, 3], vec![1f32, 0., 0., 1., 1., 1.]).unwrap();
        let b = Tensor::from_vec(&[2], vec![0.5f32, -1.]).unwrap();
        let out = interpret(&g, &[x, w, b]).unwrap();
        assert_eq!(f32s(&out[0]), vec![1.5, 5., 4.5, 14.]);
    }

    #[test]
    fn gather_rows_and_reject_out_of_range() {
        let g = one_op(
            &[ty(DType::F32, &[3, 2]), ty(DType::I64, &[2, 2])],
            Op::Gather,
        );
        let table = Tensor::from_vec(&[3, 2], vec![0f32, 1., 10., 11., 20., 21.]).unwrap();
        let ok = Tensor::from_vec(&[2, 2], vec![2i64, 0, 1, 1]).unwrap();
        let out = interpret(&g, &[table.clone(), ok]).unwrap();
        assert_eq!(out[0].shape(), &[2, 2, 2]);
        assert_eq!(f32s(&out[0]), vec![20., 21., 0., 1., 10., 11., 10., 11.]);

        for bad in [3i64, -1] {
            let indices = Tensor::from_vec(&[2, 2], vec![0i64, bad, 1, 1]).unwrap();
            match interpret(&g, &[table.clone(), indices]) {
                Err(RuntimeError::Data(message)) => {
                    assert!(message.contains(&format!("index {bad} ")), "{message}");
                    assert!(message.contains("gather"), "{message}");
                }
                other => panic!("expected a data error, got {other:?}"),
            }
        }
    }

    #[test]
    fn f16_results_are_rounded_after_every_op() {
        // (a + b) - a with a = 1 and b = 2^-11: 1 + 2^-11 ties to 1.0 in f16, so the result is 0,
        // where unrounded f32 arithmetic would give 2^-11.
        let mut g = Graph::new();
        let a = g.input("a", ty(DType::F16, &[2]));
        let b = g.input("b", ty(DType::F16, &[2]));
        let sum = g.add(Op::Binary(BinaryOp::Add), &[a, b]).unwrap();
        let diff = g.add(Op::Binary(BinaryOp::Sub), &[sum, a]).unwrap();
        g.set_outputs(vec![sum, diff]);
        let av = Tensor::from_vec(&[2], vec![f16::ONE, f16::ONE]).unwrap();
        // 2^-11 (a tie, rounds to even = 1.0) and 3·2^-12 (rounds up to 1 + 2^-10).
        let bv = Tensor::from_vec(
            &[2],
            vec![f16::from_f64(0.00048828125), f16::from_f64(0.000732421875)],
        )
        .unwrap();
        let out = interpret(&g, &[av, bv]).unwrap();
        assert_eq!(out[0].dtype(), DType::F16);
        assert_eq!(
            out[0].to_vec::<f16>().unwrap(),
            vec![f16::ONE, f16::from_f64(1.0009765625)]
        );
        assert_eq!(out[1].to_f64_vec(), vec![0.0, 0.0009765625]);

        // 1/3 in f16 is 0.333251953125, not the f32 0.33333334.
        let mut g = Graph::new();
        let x = g.input("x", ty(DType::F16, &[1]));
        let three = g.constant(3.0, DType::F16);
        let y = g.add(Op::Binary(BinaryOp::Div), &[x, three]).unwrap();
        g.set_outputs(vec![y]);
        let out = interpret(&g, &[Tensor::from_vec(&[1], vec![f16::ONE]).unwrap()]).unwrap();
        assert_eq!(out[0].to_f64_vec(), vec![0.333251953125]);
    }

    #[test]
    fn wrong_input_dtype_is_an_error() {
        let g = one_op(&[ty(DType::F32, &[2])], Op::Relu);
        let x = Tensor::from_vec(&[2], vec![1i64, 2]).unwrap();
        match interpret(&g, &[x]) {
            Err(RuntimeError::DType {
                name,
                expected,
                found,
            }) => {
                assert_eq!(
                    (name.as_str(), expected.as_str(), found.as_str()),
                    ("x0", "f32", "i64")
                );
            }
            other => panic!("expected a dtype error, got {other:?}"),
        }
    }

    #[test]
    fn reductions_mean_and_var() {
        let x = Tensor::from_vec(&[2, 3], vec![1f32, 2., 6., f32::NAN, 0., 1.]).unwrap();
        let sum = Op::Reduce {
            op: ReduceOp::Sum,
            axes: vec![0],
            keepdim: true,
        };
        let out = interpret(
            &one_op(&[ty(DType::F32, &[2, 3])], sum),
            std::slice::from_ref(&x),
        )
        .unwrap();
        assert_eq!(out[0].shape(), &[1, 3]);
        let v = f32s(&out[0]);
        assert!(v[0].is_nan());
        assert_eq!(&v[1..], &[2., 7.]);

        let max = Op::Reduce {
            op: ReduceOp::Max,
            axes: vec![1],
            keepdim: false,
        };
        let v = f32s(&interpret(&one_op(&[ty(DType::F32, &[2, 3])], max), &[x]).unwrap()[0]);
        assert_eq!(v[0], 6.);
        assert!(v[1].is_nan());

        let x = Tensor::from_vec(&[2, 3], vec![1f32, 2., 6., 0., 0., 3.]).unwrap();
        let mean = Op::Mean {
            axes: vec![1],
            keepdim: false,
        };
        let v = f32s(
            &interpret(
                &one_op(&[ty(DType::F32, &[2, 3])], mean),
                std::slice::from_ref(&x),
            )
            .unwrap()[0],
        );
        assert_eq!(v, vec![3., 1.]);
        let var = Op::Var {
            axes: vec![0, 1],
            correction: 1,
            keepdim: false,
        };
        let out = interpret(&one_op(&[ty(DType::F32, &[2, 3])], var), &[x]).unwrap();
        assert_eq!(out[0].shape(), &[] as &[usize]);
        // mean 2, squared deviations 1+0+16+4+4+1 = 26, over 5.
        assert_close(&f32s(&out[0]), &[5.2], 1e-6);
    }

    #[test]
    fn views_cat_where_and_cast() {
        let mut g = Graph::new();
        let x = g.input("x", ty(DType::F32, &[2, 3]));
        let p = g.add(Op::Permute { perm: vec![1, 0] }, &[x]).unwrap();
        let s = g
            .add(
                Op::Slice {
                    dim: 0,
                    start: 0,
                    end: 3,
                    step: 2,
                    from: SliceFrom::Start,
                },
                &[p],
            )
            .unwrap();
        let c = g.add(Op::Cat { dim: 0 }, &[s, p]).unwrap();
        let zero = g.constant(2.5, DType::F32);
        let gt = g.add(Op::Compare(CompareOp::Gt), &[c, zero]).unwrap();
        let neg = g.add(Op::Unary(UnaryOp::Neg), &[c]).unwrap();
        let w = g.add(Op::Where, &[gt, c, neg]).unwrap();
        let i = g.add(Op::Cast { dtype: DType::I64 }, &[w]).unwrap();
        let e = g
            .add(
                Op::Expand {
                    shape: static_shape(&[2, 5, 2]),
                },
                &[i],
            )
            .unwrap();
        g.set_outputs(vec![s, c, w, e]);
        g.verify().unwrap();
        let xv = Tensor::from_vec(&[2, 3], vec![1f32, 2., 3., 4., 5., 6.]).unwrap();
        let out = interpret(&g, &[xv]).unwrap();
        assert_eq!(f32s(&out[0]), vec![1., 4., 3., 6.]);
        assert_eq!(f32s(&out[1]), vec![1., 4., 3., 6., 1., 4., 2., 5., 3., 6.]);
        assert_eq!(
            f32s(&out[2]),
            vec![-1., 4., 3., 6., -1., 4., -2., 5., 3., 6.]
        );
        assert_eq!(out[3].shape(), &[2, 5, 2]);
        let iv = out[3].to_vec::<i64>().unwrap();
        assert_eq!(&iv[..10], &[-1, 4, 3, 6, -1, 4, -2, 5, 3, 6]);
        assert_eq!(&iv[..10], &iv[10..]);
    }

    #[test]
    fn composites_pointwise() {
        let x = Tensor::from_vec(&[4], vec![-1f32, 0., 1., f32::NAN]).unwrap();
        let run = |op: Op| {
            f32s(
                &interpret(
                    &one_op(&[ty(DType::F32, &[4])], op),
                    std::slice::from_ref(&x),
                )
                .unwrap()[0],
            )
        };
        let relu = run(Op::Relu);
        assert_eq!(&relu[..3], &[0., 0., 1.]);
        assert!(relu[3].is_nan());
        let gelu = run(Op::Gelu { tanh: false });
        assert_close(&gelu[..3], &[-0.15865526, 0., 0.8413447], 1e-6);
        let gelu_tanh = run(Op::Gelu { tanh: true });
        assert_close(&gelu_tanh[..3], &[-0.15880801, 0., 0.841192], 1e-6);
        let silu = run(Op::Silu);
        assert_close(&silu[..3], &[-0.26894143, 0., 0.7310586], 1e-6);
        let clamp = run(Op::Clamp {
            min: Some(-0.5),
            max: Some(0.5),
        });
        assert_eq!(&clamp[..3], &[-0.5, 0., 0.5]);
        assert!(clamp[3].is_nan());
    }
}
