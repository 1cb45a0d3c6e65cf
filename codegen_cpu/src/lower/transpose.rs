//! Transposed copies: a kernel whose one stage stores, contiguously along its loop, an element
//! (f32, f16, bf16 or i64) loaded contiguously along the kernel's *last outer* loop (`out[o, i]
//! = x[i, o]`: a materialized `.t()`, an NCHW ↔ NHWC permute, a copy from `split_transposes`;
//! `Kernel::transposed_copy`) runs each run of its last outer loop as one call of the kernel
//! library's transpose routine for the element's size (`minductor_kernels::transpose`: for f32,
//! 16 × 16 tiles transposed in registers on AVX-512, 8 × 8 on AVX2) instead of the 4-lane loop,
//! which gathers every element from another cache line (and for f16 and bf16 converts each to
//! f32 and back).
//!
//! The routine reads and writes exactly the elements the loop would (the run's columns `o`,
//! every `i` of the stage), so the kernel IR verifier's bounds hold for it as for the loop, and
//! it copies bit patterns, so the result is the loop's bit for bit. The outer loops before the
//! last run as usual; when the runtime's range flattens the last loop with them
//! (`Kernel::split_loops`), the range is walked in runs that each end at the range's end or at
//! the end of a row of the last loop.

use super::*;
use minductor_kernels::transpose::{
    transpose_bits, transpose_routine, TransposeFn, TRANSPOSE_ARGS_BYTES, TRANSPOSE_ARGS_COLUMNS,
    TRANSPOSE_ARGS_DST, TRANSPOSE_ARGS_DST_STRIDE, TRANSPOSE_ARGS_ROWS, TRANSPOSE_ARGS_SRC,
    TRANSPOSE_ARGS_SRC_STRIDE,
};

/// A kernel that is one transposed copy: the store and the load it stores.
#[derive(Clone)]
pub(super) struct TransposedCopy {
    src: BufferId,
    load: Affine,
    dst: BufferId,
    store: Affine,
    /// Bytes per element.
    size: i64,
    /// The kernel library's routine for elements of `size` bytes.
    routine: TransposeFn,
}

impl TransposedCopy {
    /// The vector width the routine copies at (for reports).
    pub(super) fn bits(&self) -> u32 {
        transpose_bits(self.size as usize).expect("a routine for the copy's element size")
    }
}

/// `kernel` as a transposed copy whose contiguous load runs along its last outer loop (see
/// `Kernel::transposed_copy`; `choose_loop_order` puts that loop last).
pub(super) fn transposed_copy(kernel: &Kernel, program: &Program) -> Option<TransposedCopy> {
    if kernel.transposed_copy(program)? + 1 != kernel.outer.len() {
        return None;
    }
    let StageAction::Store(stores) = &kernel.stages[0].action else {
        unreachable!("a transposed copy stores")
    };
    let Expr::Load { buffer, index, .. } = kernel.expr(stores[0].value) else {
        unreachable!("a transposed copy stores a load")
    };
    let size = program.buffer(*buffer).dtype.size_bytes();
    Some(TransposedCopy {
        src: *buffer,
        load: index.clone(),
        dst: stores[0].buffer,
        store: stores[0].index.clone(),
        size: size as i64,
        routine: transpose_routine(size)?,
    })
}

impl Lowering<'_, '_, '_> {
    /// The runs of `start..end` over the first `split` outer loops flattened (the last outer
    /// loop among them), `run(lo, hi)` emitting each (a routine call over columns `lo..hi` of
    /// the last loop, the other outer loops' variables set): `i` walks the range; at each step
    /// the loops' digits of `i` are computed, and the run goes from the last digit to the end
    /// of its row or of the range. Transposed copies and row runs (`rows.rs`) walk it so.
    pub(super) fn last_loop_runs(
        &mut self,
        start: Value,
        end: Value,
        extents: &[Value],
        mut run: impl FnMut(&mut Self, Value, Value),
    ) {
        let split = self.split;
        let last = self.kernel.outer.len() - 1;
        debug_assert_eq!(
            split,
            last + 1,
            "runs when the range flattens every outer loop"
        );
        let head = self.loop_head(start);
        let go = self.b.ins().icmp(IntCC::SignedLessThan, head.i, end);
        self.b.ins().brif(go, head.body, &[], head.exit, &[]);
        self.b.switch_to_block(head.body);
        self.forget();
        let digits = self.digits(head.i, &extents[..split]);
        for (j, &d) in digits.iter().enumerate().take(last) {
            self.vars.insert(Var::Outer(j as u32), d);
        }
        let lo = digits[last];
        let left = self.b.ins().isub(end, head.i);
        let row_end = self.b.ins().iadd(lo, left);
        let hi = self.b.ins().smin(row_end, extents[last]);
        run(self, lo, hi);
        let length = self.b.ins().isub(hi, lo);
        let next = self.b.ins().iadd(head.i, length);
        self.forget();
        self.loop_tail(&head, next);
    }

    /// One call of the routine for columns `lo..hi` of the last outer loop, at the current
    /// values of the other outer loops.
    pub(super) fn transpose_call(
        &mut self,
        copy: &TransposedCopy,
        lo: Value,
        hi: Value,
        extents: &[Value],
    ) {
        let outer = self.kernel.outer.len();
        let last = Var::Outer(outer as u32 - 1);
        let inner = Var::Inner(0);
        let zero = self.b.ins().iconst(types::I64, 0);
        self.vars.insert(last, lo);
        self.vars.insert(inner, zero);
        let src = self.invariant_address(copy.src, &copy.load);
        let dst = self.invariant_address(copy.dst, &copy.store);
        let src_stride = self.size_value(&copy.load.coefficient(inner), copy.size);
        let dst_stride = self.size_value(&copy.store.coefficient(last), copy.size);
        let columns = self.b.ins().isub(hi, lo);
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            TRANSPOSE_ARGS_BYTES,
            3,
        ));
        let args = self.b.ins().stack_addr(types::I64, slot, 0);
        let flags = MemFlagsData::trusted();
        for (value, at) in [
            (src, TRANSPOSE_ARGS_SRC),
            (src_stride, TRANSPOSE_ARGS_SRC_STRIDE),
            (dst, TRANSPOSE_ARGS_DST),
            (dst_stride, TRANSPOSE_ARGS_DST_STRIDE),
            (extents[outer], TRANSPOSE_ARGS_ROWS),
            (columns, TRANSPOSE_ARGS_COLUMNS),
        ] {
            self.b.ins().store(flags, value, args, at);
        }
        let mut sig = Signature::new(self.b.func.signature.call_conv);
        sig.params.push(AbiParam::new(types::I64));
        let sig = self.b.import_signature(sig);
        let callee = self
            .b
            .ins()
            .iconst(types::I64, copy.routine as usize as i64);
        self.b.ins().call_indirect(sig, callee, &[args]);
    }

    /// `c · k` as a value (a constant, or computed from the symbols in the entry block).
    pub(super) fn size_value(&mut self, c: &SizeExpr, k: i64) -> Value {
        match c.as_const() {
            Some(c) => self.b.ins().iconst(types::I64, c * k),
            None => self.symbolic_times(c, k),
        }
    }
}
