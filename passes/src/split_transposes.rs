//! `split_transposes`: a kernel that loads a transposed view of a buffer (f32, f16, bf16 or i64:
//! the types the transpose routine copies) gets that view copied first, by a kernel of its own,
//! into a buffer laid out in the kernel's loop order, and then loads that buffer contiguously.
//!
//! A view is transposed for a kernel when its elements are strided along the vectorised loop
//! of the stage that loads it (the stage's loop) and contiguous along one of the kernel's outer
//! loops: `x.t() * 2` loads `x[i, o]` for output element `[o, i]`; a layer norm over the
//! channels of an NCHW tensor seen as NHWC loads `x[b, c, hw]` along `c`. Elementwise, each load
//! is then another cache line, and at power-of-two row lengths the lines of a pass share a few
//! cache sets, so each is evicted before its next element is used: `x.t() * 2` on 2048 × 2048
//! took 22.5–23.1 ms against 0.7 ms for `x * 2` (1 thread, Zen 4). The copy this pass splits
//! off is a transposed copy (`Kernel::transposed_copy`), which the code generator runs with the
//! kernel library's 16 × 16 register-transpose routine, and the kernel's stages then read
//! contiguous rows (a row routine at full vector width, where one fits). The price is one more
//! pass over the view's elements: Inductor avoids it by transposing tiles inside the fused loop
//! (`CppTile2DKernel`), which our Cranelift loops cannot do at 16 lanes.
//!
//! It applies to kernels in the inner loop order (`wants_outer_reduction` false: a reduction
//! whose stores are contiguous along the last outer loop reads such views whole in the
//! outer-reduction order instead), for each plain load of such a buffer the kernel does not
//! write, evaluated by stages of one loop, of one extent, whose stores are contiguous along it
//! (a scan down a column would still store another line each time), whose view is transposed
//! as above and holds at least [`MIN_ELEMENTS`] elements with at least [`MIN_EXTENT`] along each
//! of the two loops (symbolic sizes count as `choose_loop_order`'s hint); below that the view stays in the
//! caches and the gather is cheap. The copy covers the loops the load moves with only (a view
//! broadcast along a loop is copied once), and loads of the same view share one copy. Values
//! are copied bit for bit, so results are unchanged.

use crate::loop_order::hinted_size as hint;
use crate::wants_outer_reduction;
use minductor_ir::{Dim, SizeExpr};
use minductor_kernel_ir::*;

/// Fewest elements of a view worth copying (64 KiB of f32s).
pub const MIN_ELEMENTS: u64 = 16 * 1024;

/// Fewest iterations along the stage's loop and along the view's contiguous outer loop (one
/// tile of the transpose routine).
pub const MIN_EXTENT: u64 = 16;

/// `program` with the transposed views its kernels load copied by kernels of their own
/// (see the module docs). Other steps are unchanged.
pub fn split_transposes(program: &Program) -> Program {
    let mut buffers = program.buffers.clone();
    let mut steps = Vec::with_capacity(program.steps.len());
    let mut origin = Vec::with_capacity(program.steps.len());
    for (n, step) in program.steps.iter().enumerate() {
        let Step::Kernel(kernel) = step else {
            steps.push(step.clone());
            origin.push(vec![n]);
            continue;
        };
        let mut kernel = kernel.clone();
        for copy in split(program, &mut kernel, &mut buffers) {
            steps.push(Step::Kernel(copy));
            origin.push(Vec::new());
        }
        steps.push(Step::Kernel(kernel));
        origin.push(vec![n]);
    }
    let mut out = program.with_steps(steps, &origin);
    out.buffers = buffers;
    out
}

/// Rewrites `kernel`'s transposed loads to read fresh buffers (added to `buffers`) and returns
/// the kernels that fill them.
fn split(program: &Program, kernel: &mut Kernel, buffers: &mut Vec<Buffer>) -> Vec<Kernel> {
    if kernel.order != LoopOrder::Inner
        || wants_outer_reduction(kernel)
        || kernel.transposed_copy(program).is_some()
    {
        return Vec::new();
    }
    let inner = Var::Inner(0);
    let stored = kernel.stores();
    // The one loop extent of the stages that evaluate each expression: `None` where none does,
    // or where one has not exactly one loop, or stores strided along it (a scan along a column:
    // its stores would still be another line each), or two have different extents.
    let mut extent_of: Vec<Option<Option<Dim>>> = vec![None; kernel.exprs.len()];
    for stage in &kernel.stages {
        let contiguous_stores = (stage.action.stores().iter())
            .all(|st| st.index.coefficient(inner).is(1) || !st.index.uses(inner));
        let one = match stage.extent.as_slice() {
            [d] if contiguous_stores => Some(*d),
            _ => None,
        };
        for e in kernel.reachable(&stage.action.roots()) {
            let seen = &mut extent_of[e.0 as usize];
            *seen = match *seen {
                None => Some(one),
                Some(d) if d == one => Some(d),
                Some(_) => Some(None),
            };
        }
    }
    // (buffer, index, extent) of each view copied, and the buffer holding its copy.
    let mut copied: Vec<(BufferId, Affine, Dim, BufferId)> = Vec::new();
    let mut copies = Vec::new();
    for (n, extent) in extent_of.into_iter().enumerate() {
        let e = ExprId(n as u32);
        let Some(Some(extent)) = extent else {
            continue;
        };
        let Expr::Load {
            buffer,
            index,
            indirect: None,
        } = kernel.expr(e).clone()
        else {
            continue;
        };
        let dtype = program.buffer(buffer).dtype;
        if !transposed_copy_dtype(dtype) || stored.contains(&buffer) {
            continue;
        }
        let along = index.coefficient(inner);
        if along.is(1) || along.is_zero() {
            continue;
        }
        // The outer loops the view moves with, in the kernel's order.
        let loops: Vec<usize> = (0..kernel.outer.len())
            .filter(|&o| index.uses(Var::Outer(o as u32)))
            .collect();
        let Some(&contiguous) = loops
            .iter()
            .find(|&&o| index.coefficient(Var::Outer(o as u32)).is(1))
        else {
            continue;
        };
        let elements = (loops.iter())
            .map(|&o| hint(&kernel.outer[o]))
            .fold(hint(&extent), u64::saturating_mul);
        if elements < MIN_ELEMENTS
            || hint(&extent) < MIN_EXTENT
            || hint(&kernel.outer[contiguous]) < MIN_EXTENT
        {
            continue;
        }
        // The copy: `[outer loops the view moves with..., the stage's loop]`, row-major.
        let mut shape: Vec<Dim> = loops.iter().map(|&o| kernel.outer[o]).collect();
        shape.push(extent);
        let strides: Vec<SizeExpr> = (0..shape.len())
            .map(|d| SizeExpr::product(&shape[d + 1..]))
            .collect();
        let copy_index = |var_of: &dyn Fn(usize) -> Var| Affine {
            offset: SizeExpr::Const(0),
            terms: (0..shape.len())
                .map(|d| (var_of(d), strides[d].clone()))
                .collect(),
        };
        let same = |(b, i, d, _): &&(BufferId, Affine, Dim, BufferId)| {
            *b == buffer && *i == index && *d == extent
        };
        let target = match copied.iter().find(same) {
            Some(&(_, _, _, target)) => target,
            None => {
                let target = BufferId(buffers.len() as u32);
                buffers.push(Buffer {
                    dtype,
                    shape: shape.clone(),
                    kind: BufferKind::Intermediate,
                    node: program.buffer(buffer).node,
                });
                copied.push((buffer, index.clone(), extent, target));
                // In the copy kernel, outer loop `j` is the kernel's loop `loops[j]`.
                let renamed = Affine {
                    offset: index.offset.clone(),
                    terms: (index.terms.iter())
                        .map(|(v, c)| match v {
                            Var::Outer(o) => {
                                let j = loops.iter().position(|&l| l == *o as usize);
                                (
                                    Var::Outer(j.expect("a loop the view uses") as u32),
                                    c.clone(),
                                )
                            }
                            Var::Inner(_) => (*v, c.clone()),
                        })
                        .collect(),
                };
                let store = copy_index(&|d| {
                    if d < loops.len() {
                        Var::Outer(d as u32)
                    } else {
                        inner
                    }
                });
                copies.push(Kernel {
                    name: format!("{}_transpose{}", kernel.name, copies.len()),
                    outer: shape[..loops.len()].to_vec(),
                    order: LoopOrder::Inner,
                    stages: vec![Stage {
                        extent: vec![extent],
                        action: StageAction::Store(vec![Store {
                            buffer: target,
                            index: store,
                            value: ExprId(0),
                        }]),
                    }],
                    exprs: vec![Expr::Load {
                        buffer,
                        index: renamed,
                        indirect: None,
                    }],
                    types: vec![kernel.types[e.0 as usize]],
                    nodes: Vec::new(),
                });
                target
            }
        };
        let contiguous_index = copy_index(&|d| {
            if d < loops.len() {
                Var::Outer(loops[d] as u32)
            } else {
                inner
            }
        });
        kernel.exprs[e.0 as usize] = Expr::Load {
            buffer: target,
            index: contiguous_index,
            indirect: None,
        };
    }
    copies
}
