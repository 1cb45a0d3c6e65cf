//! `compile_program`: JIT-compiles every kernel of a `Program` and returns an [`Executable`]
//! that runs the steps in order: Cranelift kernels and extern GEMM calls.

use crate::lower::{kernel_function, lower_kernel};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module};
use minductor_ir::DType;
use minductor_passes::kernel::{BufferId, BufferKind, Kernel, MatmulStep, Program, Step};
use minductor_runtime::{Executable, RuntimeError, Tensor};
use std::time::{Duration, Instant};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum CodegenError {
    #[error("cranelift: {0}")]
    Cranelift(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
}

/// The signature of every compiled kernel (see `lower`).
type KernelFn = unsafe extern "C" fn(*const *mut u8, *const i64, i64, i64);

pub struct CompiledKernel {
    pub name: String,
    /// Cranelift IR text of the kernel, as compiled (before machine lowering).
    pub clif: String,
    function: KernelFn,
    buffers: Vec<BufferId>,
    params: Vec<i64>,
    /// Extent of the first outer loop, the range the function is called with (1 if none).
    range: i64,
    /// Elements the kernel visits per call (all loop trip counts), to decide on threading.
    work: i64,
}

/// Kernels visiting fewer elements than this run on the calling thread.
const PARALLEL_WORK_THRESHOLD: i64 = 1 << 15;

/// The pointer table, shared read-only by the threads running one kernel.
struct SharedPointers(*const *mut u8);
// SAFETY: the table and the buffers behind it outlive the parallel loop (it joins before `run`
// continues), and the chunks of the first outer loop write disjoint elements (see `run`).
unsafe impl Send for SharedPointers {}
unsafe impl Sync for SharedPointers {}

enum CompiledStep {
    Kernel(CompiledKernel),
    Matmul(MatmulStep),
}

/// The owner of the machine code. Only dropped, never used after finalisation.
struct CodeOwner(#[allow(dead_code)] JITModule);
// SAFETY: after `finalize_definitions` the module's memory is immutable code; moving its owner to
// another thread changes nothing about it. The module is never used again except by Drop.
unsafe impl Send for CodeOwner {}

pub struct CompiledProgram {
    pub program: Program,
    steps: Vec<CompiledStep>,
    /// Intermediate buffers, allocated once and kept between calls.
    intermediates: Vec<Option<Tensor>>,
    pub compile_time: Duration,
    _code: CodeOwner,
}

fn isa() -> Result<std::sync::Arc<dyn cranelift_codegen::isa::TargetIsa>, CodegenError> {
    let mut flags = settings::builder();
    let set = |f: &mut settings::Builder, k: &str, v: &str| {
        f.set(k, v)
            .map_err(|e| CodegenError::Cranelift(e.to_string()))
    };
    set(&mut flags, "opt_level", "speed")?;
    set(&mut flags, "use_colocated_libcalls", "false")?;
    set(&mut flags, "is_pic", "false")?;
    let isa_builder =
        cranelift_native::builder().map_err(|e| CodegenError::Cranelift(e.to_string()))?;
    isa_builder
        .finish(settings::Flags::new(flags))
        .map_err(|e| CodegenError::Cranelift(e.to_string()))
}

/// Compiles every kernel of `program` to machine code.
pub fn compile_program(program: &Program) -> Result<CompiledProgram, CodegenError> {
    let started = Instant::now();
    for b in &program.buffers {
        if b.numel().is_none() {
            return Err(CodegenError::Unsupported("symbolic buffer sizes".into()));
        }
    }
    let isa = isa()?;
    let call_conv = isa.default_call_conv();
    let mut module = JITModule::new(JITBuilder::with_isa(
        isa,
        cranelift_module::default_libcall_names(),
    ));
    let mut ctx = module.make_context();
    let mut fctx = FunctionBuilderContext::new();
    let mut pending = Vec::new();
    for step in &program.steps {
        let Step::Kernel(kernel) = step else { continue };
        ctx.func = kernel_function(call_conv);
        {
            let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
            lower_kernel(&mut b, kernel, program);
            b.finalize(module.isa().frontend_config());
        }
        let clif = ctx.func.display().to_string();
        let id = module
            .declare_function(&kernel.name, Linkage::Local, &ctx.func.signature)
            .map_err(|e| CodegenError::Cranelift(e.to_string()))?;
        module
            .define_function(id, &mut ctx)
            .map_err(|e| CodegenError::Cranelift(format!("{}: {e:?}\n{clif}", kernel.name)))?;
        module.clear_context(&mut ctx);
        pending.push((id, clif));
    }
    module
        .finalize_definitions()
        .map_err(|e| CodegenError::Cranelift(e.to_string()))?;
    let mut pending = pending.into_iter();
    let mut steps = Vec::new();
    for step in &program.steps {
        steps.push(match step {
            Step::Kernel(kernel) => {
                let (id, clif) = pending.next().expect("one function per kernel");
                let code = module.get_finalized_function(id);
                // SAFETY: `code` was compiled from `kernel_function`'s signature, which is KernelFn's.
                let function = unsafe { std::mem::transmute::<*const u8, KernelFn>(code) };
                CompiledStep::Kernel(CompiledKernel {
                    name: kernel.name.clone(),
                    clif,
                    function,
                    buffers: kernel.buffers(),
                    params: static_params(kernel),
                    work: kernel_work(kernel),
                    range: kernel
                        .outer
                        .first()
                        .map_or(1, |d| d.as_static().expect("checked static") as i64),
                })
            }
            Step::Matmul(m) => CompiledStep::Matmul(m.clone()),
        });
    }
    let intermediates = program
        .buffers
        .iter()
        .map(|b| {
            (b.kind == BufferKind::Intermediate)
                .then(|| Tensor::zeros(b.dtype, &static_sizes(&b.shape)))
        })
        .collect();
    Ok(CompiledProgram {
        program: program.clone(),
        steps,
        intermediates,
        compile_time: started.elapsed(),
        _code: CodeOwner(module),
    })
}

fn static_sizes(shape: &[minductor_ir::Dim]) -> Vec<usize> {
    shape
        .iter()
        .map(|d| d.as_static().expect("checked static"))
        .collect()
}

fn kernel_work(kernel: &Kernel) -> i64 {
    let size = |dims: &[minductor_ir::Dim]| {
        dims.iter()
            .map(|d| d.as_static().expect("checked static") as i64)
            .product::<i64>()
    };
    size(&kernel.outer) * kernel.stages.iter().map(|s| size(&s.extent)).sum::<i64>()
}

fn static_params(kernel: &Kernel) -> Vec<i64> {
    kernel
        .params()
        .iter()
        .map(|d| d.as_static().expect("checked static") as i64)
        .collect()
}

impl CompiledProgram {
    pub fn kernels(&self) -> impl Iterator<Item = &CompiledKernel> {
        self.steps.iter().filter_map(|s| match s {
            CompiledStep::Kernel(k) => Some(k),
            _ => None,
        })
    }
}

impl Executable for CompiledProgram {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
        // The intermediates are moved out for the call, so this call owns them uniquely and
        // writes them through `data_mut_ptr`; they are put back whatever the outcome.
        let mut tensors = std::mem::take(&mut self.intermediates);
        let result = self.run_steps(inputs, &mut tensors);
        for (slot, buffer) in tensors.iter_mut().zip(&self.program.buffers) {
            if buffer.kind != BufferKind::Intermediate {
                *slot = None;
            }
        }
        self.intermediates = tensors;
        result
    }

    fn arena_bytes(&self) -> usize {
        self.intermediates
            .iter()
            .flatten()
            .map(|t| t.numel() * t.dtype().size_bytes())
            .sum()
    }
}

impl CompiledProgram {
    /// Fills the input and output slots of `tensors` (which holds the intermediates) and runs
    /// every step.
    fn run_steps(
        &self,
        inputs: &[Tensor],
        tensors: &mut [Option<Tensor>],
    ) -> Result<Vec<Tensor>, RuntimeError> {
        let program = &self.program;
        // Every buffer the compiled code touches, checked against the plan: this is the fence
        // that keeps JIT code inside its buffers.
        for (index, b) in program.buffers.iter().enumerate() {
            match b.kind {
                BufferKind::Input(n) => {
                    let t = inputs.get(n).ok_or(RuntimeError::Arity {
                        expected: n + 1,
                        found: inputs.len(),
                    })?;
                    if t.dtype() != b.dtype || t.shape() != static_sizes(&b.shape).as_slice() {
                        return Err(RuntimeError::Shape {
                            name: format!("#{n}"),
                            expected: format!("{}{:?}", b.dtype, static_sizes(&b.shape)),
                            found: t.shape().to_vec(),
                        });
                    }
                    tensors[index] = Some(t.contiguous());
                }
                BufferKind::Output => {
                    tensors[index] = Some(Tensor::zeros(b.dtype, &static_sizes(&b.shape)))
                }
                BufferKind::Intermediate => {}
            }
        }
        let mut pointers: Vec<*mut u8> = Vec::with_capacity(8);
        for (n, step) in self.steps.iter().enumerate() {
            for check in program.index_checks.iter().filter(|c| c.step == n) {
                let t = tensors[check.buffer.0 as usize]
                    .as_ref()
                    .expect("index buffers are filled before use");
                if let Some(bad) = t
                    .to_vec::<i64>()?
                    .into_iter()
                    .find(|&i| i < 0 || i >= check.bound)
                {
                    return Err(RuntimeError::Data(format!(
                        "embedding index {bad} is out of range for a table of {} rows",
                        check.bound
                    )));
                }
            }
            match step {
                CompiledStep::Kernel(k) => {
                    pointers.clear();
                    for id in &k.buffers {
                        pointers.push(buffer_ptr(tensors, *id));
                    }
                    // SAFETY: every pointer is the start of a live, contiguous buffer whose size
                    // is the one `fuse` planned (checked above for inputs, allocated from the
                    // plan otherwise); `fuse` guarantees each index stays inside its buffer for
                    // loop extents equal to `params`, and the ranges cover the first outer loop.
                    // Threads get disjoint ranges of that loop: a kernel's store index is the
                    // row-major index of its own iteration domain, so disjoint ranges write
                    // disjoint elements, and no kernel reads a buffer it writes. Each element's
                    // value (reductions included) is computed within one call, so results do not
                    // depend on the thread count.
                    let threads = rayon::current_num_threads() as i64;
                    if threads > 1 && k.range > 1 && k.work >= PARALLEL_WORK_THRESHOLD {
                        let chunks = threads.min(k.range);
                        let table = SharedPointers(pointers.as_ptr());
                        let (function, params, range) =
                            (k.function, k.params.as_ptr() as usize, k.range);
                        rayon::scope(|scope| {
                            for c in 0..chunks {
                                let table = &table;
                                scope.spawn(move |_| {
                                    let (start, end) =
                                        (range * c / chunks, range * (c + 1) / chunks);
                                    unsafe { function(table.0, params as *const i64, start, end) };
                                });
                            }
                        });
                    } else {
                        unsafe { (k.function)(pointers.as_ptr(), k.params.as_ptr(), 0, k.range) };
                    }
                }
                CompiledStep::Matmul(m) => run_matmul(m, tensors),
            }
        }
        Ok(program
            .outputs
            .iter()
            .map(|id| {
                tensors[id.0 as usize]
                    .clone()
                    .expect("output buffers are filled")
            })
            .collect())
    }
}

fn buffer_ptr(tensors: &mut [Option<Tensor>], id: BufferId) -> *mut u8 {
    let t = tensors[id.0 as usize]
        .as_mut()
        .expect("every buffer is allocated before the steps run");
    // Outputs and intermediates are owned uniquely by this call. Inputs may share storage with
    // the caller: kernels only ever read them (fuse never stores to an input buffer), so the
    // const pointer cast to mut is never written through.
    t.data_mut_ptr().unwrap_or(t.data_ptr() as *mut u8)
}

fn run_matmul(m: &MatmulStep, tensors: &mut [Option<Tensor>]) {
    let batch = m.a.shape.len() - 2;
    let (rows, k, cols) = (m.a.shape[batch], m.a.shape[batch + 1], m.b.shape[batch + 1]);
    let a = buffer_ptr(tensors, m.a.buffer) as *const f32;
    let b = buffer_ptr(tensors, m.b.buffer) as *const f32;
    let c = buffer_ptr(tensors, m.out) as *mut f32;
    debug_assert!(tensors[m.out.0 as usize].as_ref().unwrap().dtype() == DType::F32);
    let count: usize = m.a.shape[..batch].iter().product();
    if rows == 0 || cols == 0 {
        return;
    }
    for n in 0..count {
        // Decompose the flat batch index into per-dim offsets.
        let (mut rest, mut a_off, mut b_off) = (n, m.a.offset, m.b.offset);
        for d in (0..batch).rev() {
            let i = (rest % m.a.shape[d]) as i64;
            rest /= m.a.shape[d];
            a_off += i * m.a.strides[d];
            b_off += i * m.b.strides[d];
        }
        let c_off = (n * rows * cols) as isize;
        // SAFETY: the views were derived by `fuse` from the buffers' shapes, so every element
        // `offset + Σ i·stride` over the view's shape lies inside its buffer; `c` is the
        // contiguous output of `count·rows·cols` f32s.
        unsafe {
            matrixmultiply::sgemm(
                rows,
                k,
                cols,
                1.0,
                a.offset(a_off as isize),
                m.a.strides[batch] as isize,
                m.a.strides[batch + 1] as isize,
                b.offset(b_off as isize),
                m.b.strides[batch] as isize,
                m.b.strides[batch + 1] as isize,
                0.0,
                c.offset(c_off),
                cols as isize,
                1,
            );
        }
    }
}
