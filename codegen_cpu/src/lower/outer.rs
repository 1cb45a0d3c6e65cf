//! The outer-reduction loop order ([`LoopOrder::OuterReduction`], Inductor's outer-loop
//! reductions): the last outer loop is the vectorised one. It runs in groups of
//! `LANES * OUTER_SLOTS` columns (`OUTER_SLOTS` vectors, one per *slot*), then of `LANES` columns, then one
//! column at a time; for each group, every stage runs its own loops (the rows) inside, one row
//! of the group at a time: a reduction keeps one accumulator per slot (a vector of partial
//! results, one per column), a store stage stores one vector per slot and row. A column sum of a
//! `[rows, columns]` buffer thus reads whole cache lines, row after row, instead of gathering
//! four lanes from four rows.
//!
//! **Same bits in every column.** Each column's value comes from the same operations in the same
//! order whether its column is a vector lane or runs alone (the runtime splits the first outer
//! loop across threads at any column, so a column's place in a group depends on the thread
//! count): sums add row after row, and a max or min compares and selects (`acc < x || x != x ?
//! x : acc`, so a NaN, once in, stays), in vector lanes and scalars alike.
//!
//! **Sums in blocks.** A sum's innermost row loop adds blocks of [`OUTER_SUM_BLOCK`] rows into
//! fresh accumulators and each block's partial sums into running ones with Kahan compensation
//! (as the inner order does with `SUM_BLOCK`), so long columns keep the accuracy of one block.
//!
//! **Math blocks.** In a whole column group (`OUTER_SLOTS` vectors), a stage's `exp`, `erf`,
//! `tanh`, … run in blocks of `MATH_BLOCK / (LANES * OUTER_SLOTS)` rows (see `math_rows`): their
//! arguments at every row and column of the block go into a buffer, one call of the
//! ahead-of-time routine (16 lanes on AVX-512) computes them, and the stage's body reads the
//! results, as the inner order does along a row. The routines compute what the inline form
//! does, bit for bit, so narrower groups, which compute inline, agree with them.
//!
//! **Column routines.** A stage that is a plain sum of an f32 load (a bias gradient) takes its
//! sums from the kernel library's column routine (`math::block::columns`: the same bits, at
//! the CPU's full vector width). The whole groups of the range run in runs of up to
//! [`WIDE_COLUMNS`] columns: one call per such stage sums the run's columns into a stack buffer
//! (one pass down the rows reading a kilobyte of each, where a group's 128 bytes per row would
//! leave the pass waiting on every load), then the run's groups are emitted as usual, each
//! reading its columns' sums from the buffer. The call reads the summed buffer before the run's
//! earlier stages write anything, so a kernel that stores to the buffer it sums keeps the loop.
//!
//! A stage with a value that has no 4-lane form (an i64 or bool store, an i64 value varying
//! along the columns) runs, in vector groups, one column at a time: scalar code at each lane's
//! column, reading earlier stages' results from their lanes; its results are gathered back into
//! vectors.

use super::*;
use crate::math::block::block_isa;
use crate::math::block::columns::{
    column_routine, COLUMNS, COLUMN_ARGS_BYTES, COLUMN_ARGS_COLUMNS, COLUMN_ARGS_OUT,
    COLUMN_ARGS_ROWS, COLUMN_ARGS_STRIDE, COLUMN_ARGS_X, WIDE_COLUMNS,
};

const _: () = assert!(COLUMNS == LANES as usize * OUTER_SLOTS);
const _: () = assert!(
    WIDE_COLUMNS.is_multiple_of(COLUMNS),
    "a routine call covers whole groups"
);
const _: () = assert!(
    crate::math::block::columns::OUTER_SUM_BLOCK == OUTER_SUM_BLOCK as usize,
    "the column routine blocks its sums as this order does"
);

/// Rows a sum's accumulator adds in a row before its partial sum goes into the running one (see
/// the module docs): each lane adds at most this many values in a row, as in the inner order.
pub const OUTER_SUM_BLOCK: i64 = 64;

/// Vectors per column group: each row of a group reads `LANES * OUTER_SLOTS` contiguous columns.
pub const OUTER_SLOTS: usize = 8;

/// A blocked sum's reset (before each block of rows) and fold (after it).
type RowBlocks<'a, L> = (&'a dyn Fn(&mut L), &'a dyn Fn(&mut L));

/// A vector group's math-block functions by level, and its columns (see `math_rows`).
type MathRows<'a> = (&'a [Vec<BlockMath>], &'a [Column]);

/// The column of the group being emitted: its slot (whose results it reads and writes), the lane
/// within the slot's vector when scalar code runs for one lane of a vector group, and its
/// distance from the group's first column.
#[derive(Clone, Copy)]
pub(super) struct Column {
    slot: usize,
    lane: Option<u8>,
    offset: i64,
}

impl Column {
    pub(super) const FIRST: Column = Column {
        slot: 0,
        lane: None,
        offset: 0,
    };
}

impl Lowering<'_, '_, '_> {
    /// The kernel in the outer-reduction order over first-outer-loop range `start..end`.
    pub(super) fn outer_order(&mut self, start: Value, end: Value, extents: &[Value]) {
        let last = self.kernel.outer.len() - 1;
        self.outer_mode = true;
        self.innermost = Some(Var::Outer(last as u32));
        // Cranelift's 4-lane vectors along the columns, but plain column sums at the column
        // routine's width; a stage without loops of its own has none.
        self.stage_bits = (self.kernel.stages.iter())
            .map(|stage| {
                if stage.extent.is_empty() {
                    None
                } else if self.routine_sum(stage).is_some() {
                    Some(Self::row_bits())
                } else {
                    Some(128)
                }
            })
            .collect();
        self.outer_order_loops(0, start, end, extents);
    }

    fn outer_order_loops(&mut self, level: usize, start: Value, end: Value, extents: &[Value]) {
        let outer = self.kernel.outer.len();
        let (lo, hi) = if level == 0 {
            (start, end)
        } else {
            (self.b.ins().iconst(types::I64, 0), extents[level])
        };
        let var = Var::Outer(level as u32);
        if level + 1 < outer {
            self.counted_loop(lo, hi, 1, |l, i| {
                l.vars.insert(var, i);
                l.outer_order_loops(level + 1, start, end, extents);
            });
            return;
        }
        let stage_extents = &extents[outer..outer + self.stage_loop_count()];
        let vector = self.kernel.stages.iter().any(|s| self.vectorizable(s));
        let tail = if vector {
            let group = LANES * OUTER_SLOTS as i64;
            let summed = self.routine_sums(stage_extents);
            let unrolled_end = if summed.is_empty() {
                self.counted_loop(lo, hi, group, |l, i| {
                    l.vars.insert(var, i);
                    l.column_group(OUTER_SLOTS, Mode::Vector, stage_extents);
                })
            } else {
                // Every whole group of `lo..hi`, in runs of up to `WIDE_COLUMNS` columns.
                let zero = self.b.ins().iconst(types::I64, 0);
                let width = self.b.ins().isub(hi, lo);
                let width = self.b.ins().smax(width, zero);
                let whole = self.b.ins().band_imm_s(width, -group);
                let groups_end = self.b.ins().iadd(lo, whole);
                self.block_loop(lo, groups_end, WIDE_COLUMNS as i64, |l, first, last| {
                    l.vars.insert(var, first);
                    let columns = l.b.ins().isub(last, first);
                    for (n, sum, rows) in &summed {
                        let sums = l.column_sums(sum.clone(), *rows, columns);
                        l.routine_sums[*n] = Some((sums, first));
                    }
                    l.counted_loop(first, last, group, |l, i| {
                        l.vars.insert(var, i);
                        l.column_group(OUTER_SLOTS, Mode::Vector, stage_extents);
                    });
                    l.routine_sums.iter_mut().for_each(|s| *s = None);
                });
                groups_end
            };
            self.counted_loop(unrolled_end, hi, LANES, |l, i| {
                l.vars.insert(var, i);
                l.column_group(1, Mode::Vector, stage_extents);
            })
        } else {
            lo
        };
        self.counted_loop(tail, hi, 1, |l, i| {
            l.vars.insert(var, i);
            l.column_group(1, Mode::Scalar, stage_extents);
        });
    }

    fn stage_loop_count(&self) -> usize {
        self.kernel.stages.iter().map(|s| s.extent.len()).sum()
    }

    /// Every stage for the `slots` column slots starting at the current column (vectors of
    /// `LANES` columns in `Mode::Vector`, one column in `Mode::Scalar`).
    fn column_group(&mut self, slots: usize, mode: Mode, extents: &[Value]) {
        let kernel = self.kernel;
        self.outer_results = vec![Vec::new(); kernel.stages.len()];
        let mut offset = 0;
        for (n, stage) in kernel.stages.iter().enumerate() {
            let ext = &extents[offset..offset + stage.extent.len()];
            offset += stage.extent.len();
            if let (Mode::Vector, OUTER_SLOTS, Some(sums)) = (mode, slots, self.routine_sums[n]) {
                self.outer_results[n] =
                    self.group_sums(sums).into_iter().map(Val::Vector).collect();
                continue;
            }
            let results = if mode == Mode::Vector && !self.vectorizable(stage) {
                // One column at a time, each lane of each slot.
                let mut lanes: Vec<Vec<Value>> = vec![Vec::new(); slots];
                for (slot, lanes) in lanes.iter_mut().enumerate() {
                    for lane in 0..LANES {
                        let column = Column {
                            slot,
                            lane: Some(lane as u8),
                            offset: slot as i64 * LANES + lane,
                        };
                        if let Some(v) = self.outer_stage(stage, ext, Mode::Scalar, &[column]) {
                            lanes.push(v[0]);
                        }
                    }
                }
                if lanes[0].is_empty() {
                    Vec::new()
                } else {
                    lanes
                        .into_iter()
                        .map(|lanes| {
                            let mut v = self.b.ins().scalar_to_vector(types::F32X4, lanes[0]);
                            for (i, &x) in lanes.iter().enumerate().skip(1) {
                                v = self.b.ins().insertlane(v, x, i as u8);
                            }
                            Val::Vector(self.pin(v))
                        })
                        .collect()
                }
            } else {
                let columns: Vec<Column> = (0..slots)
                    .map(|slot| Column {
                        slot,
                        lane: None,
                        offset: slot as i64 * LANES,
                    })
                    .collect();
                self.outer_stage(stage, ext, mode, &columns)
                    .map(|vs| {
                        vs.into_iter()
                            .map(|v| match mode {
                                Mode::Vector => Val::Vector(v),
                                Mode::Scalar => Val::Scalar(v),
                            })
                            .collect()
                    })
                    .unwrap_or_default()
            };
            self.outer_results[n] = results;
        }
        self.column = Column::FIRST;
        self.lane_offset = 0;
        self.forget();
    }

    /// Sets the column being emitted (a new slot shares only the values uniform across columns).
    fn enter_column(&mut self, column: Column, mode: Mode) {
        self.column = column;
        self.lane_offset = column.offset;
        if mode == Mode::Vector {
            self.memo.retain(|_, v| matches!(v, Val::Scalar(_)));
        } else if column.lane.is_some() {
            // Scalar code for one lane: every value may vary with the column.
            self.memo.clear();
        }
    }

    /// One stage for `columns` (their slots' accumulators side by side in each row); a
    /// reduction's result for each of them (pinned: computed once, here).
    fn outer_stage(
        &mut self,
        stage: &Stage,
        extents: &[Value],
        mode: Mode,
        columns: &[Column],
    ) -> Option<Vec<Value>> {
        self.forget();
        // Math blocks for whole vector groups (narrower groups compute their functions inline:
        // the same bits, see `math::block`).
        let levels = if mode == Mode::Vector && columns.len() == OUTER_SLOTS {
            self.block_math(stage)
        } else {
            Vec::new()
        };
        let math = (!levels.is_empty()).then_some((levels.as_slice(), columns));
        match &stage.action {
            StageAction::Reduce { op, value, stores } => {
                let (op, value) = (*op, *value);
                let ty = match mode {
                    Mode::Vector => types::F32X4,
                    Mode::Scalar => types::F32,
                };
                let init = self.reduce_init(op, ty);
                let accs: Vec<Variable> = columns
                    .iter()
                    .map(|_| {
                        let acc = self.b.declare_var(ty);
                        self.b.def_var(acc, init);
                        acc
                    })
                    .collect();
                // A sum's running sums and compensations, side by side per column.
                let sums = (op == ReduceOp::Sum && !extents.is_empty()).then(|| {
                    let bytes = ty.bytes() * 2 * columns.len() as u32;
                    let slot = self.b.create_sized_stack_slot(StackSlotData::new(
                        StackSlotKind::ExplicitSlot,
                        bytes,
                        4,
                    ));
                    let sums = self.b.ins().stack_addr(types::I64, slot, 0);
                    for k in 0..2 * columns.len() {
                        let at = (k as u32 * ty.bytes()) as i32;
                        self.b.ins().store(self.flags, init, sums, at);
                    }
                    sums
                });
                let product = self.summed_product(op, value);
                let reset = |l: &mut Self| {
                    let zero = l.f32_like(0.0, ty);
                    for &acc in &accs {
                        l.b.def_var(acc, zero);
                    }
                };
                let fold = |l: &mut Self| {
                    let sums = sums.expect("a blocked sum");
                    for (k, &acc) in accs.iter().enumerate() {
                        let x = l.b.use_var(acc);
                        let at_r = (2 * k as u32 * ty.bytes()) as i32;
                        l.kahan_add(sums, at_r, at_r + ty.bytes() as i32, x, ty);
                    }
                };
                let mut body = |l: &mut Self| {
                    for (k, &column) in columns.iter().enumerate() {
                        l.enter_column(column, mode);
                        let acc = l.b.use_var(accs[k]);
                        let r = l.reduce_step(op, value, product, acc, mode);
                        l.b.def_var(accs[k], r);
                        l.reduce_stores(stores, mode);
                    }
                };
                let blocks: Option<RowBlocks<Self>> = match sums {
                    Some(_) => Some((&reset, &fold)),
                    None => None,
                };
                self.outer_rows(0, extents, blocks, math, &mut body);
                let mut results = Vec::new();
                for (k, &acc) in accs.iter().enumerate() {
                    let r = match sums {
                        Some(sums) => {
                            let at = (2 * k as u32 * ty.bytes()) as i32;
                            self.b.ins().load(ty, self.flags, sums, at)
                        }
                        None => self.b.use_var(acc),
                    };
                    results.push(self.pin(r));
                }
                self.forget();
                Some(results)
            }
            StageAction::Store(stores) => {
                self.outer_rows(0, extents, None, math, &mut |l| {
                    for &column in columns {
                        l.enter_column(column, mode);
                        l.store_all(stores, mode);
                    }
                });
                self.forget();
                None
            }
            StageAction::Scan(_) => unreachable!("the verifier keeps scans in the inner order"),
        }
    }

    /// The load a stage sums, when the stage is a plain sum of contiguous f32 columns over one
    /// row loop that the kernel library's column routine can take (see `math::block::columns`:
    /// the same bits as this order's loop, at the CPU's full vector width), and no stage of the
    /// kernel stores to the summed buffer (the routine reads a run's columns before the run's
    /// stages run: see the module docs).
    pub(super) fn routine_sum(&self, stage: &Stage) -> Option<(BufferId, Affine)> {
        let StageAction::Reduce {
            op: ReduceOp::Sum,
            value,
            stores,
        } = &stage.action
        else {
            return None;
        };
        if !stores.is_empty() || stage.extent.len() != 1 || !super::rows::row_kernels_enabled() {
            return None;
        }
        column_routine(block_isa()?)?;
        match self.kernel.expr(*value) {
            Expr::Load {
                buffer,
                index,
                indirect: None,
            } if self.program.buffer(*buffer).dtype == DType::F32
                && index.coefficient(self.innermost?).is(1)
                && !(self.kernel.stages.iter())
                    .any(|s| s.action.stores().iter().any(|st| st.buffer == *buffer)) =>
            {
                Some((*buffer, index.clone()))
            }
            _ => None,
        }
    }

    /// The stages whose sums the column routine computes (see [`Self::routine_sum`]): each
    /// one's index, summed load and row count (from `extents`, the stages' loop extents).
    fn routine_sums(&self, extents: &[Value]) -> Vec<(usize, (BufferId, Affine), Value)> {
        let mut offset = 0;
        let mut summed = Vec::new();
        for (n, stage) in self.kernel.stages.iter().enumerate() {
            if let Some(sum) = self.routine_sum(stage) {
                summed.push((n, sum, extents[offset]));
            }
            offset += stage.extent.len();
        }
        summed
    }

    /// The sums of `columns` columns (a whole number of groups, at most [`WIDE_COLUMNS`]) of
    /// `sum` from the current column, over `rows` rows, by one call of the column routine:
    /// the address of a stack buffer holding them.
    fn column_sums(&mut self, sum: (BufferId, Affine), rows: Value, columns: Value) -> Value {
        let isa = block_isa().expect("checked by routine_sum");
        let routine = column_routine(isa).expect("checked by routine_sum");
        self.enter_column(Column::FIRST, Mode::Vector);
        // The first column at rows 0 and 1: the row stride in bytes.
        let var = Var::Inner(0);
        let zero = self.b.ins().iconst(types::I64, 0);
        let one = self.b.ins().iconst(types::I64, 1);
        self.vars.insert(var, zero);
        let first = self.address(sum.0, &sum.1, None, 0);
        self.vars.insert(var, one);
        let second = self.address(sum.0, &sum.1, None, 0);
        let stride = self.b.ins().isub(second, first);
        let args = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            COLUMN_ARGS_BYTES,
            3,
        ));
        let out = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            (WIDE_COLUMNS * 4) as u32,
            6,
        ));
        let args = self.b.ins().stack_addr(types::I64, args, 0);
        let out = self.b.ins().stack_addr(types::I64, out, 0);
        let flags = self.flags;
        self.b.ins().store(flags, first, args, COLUMN_ARGS_X);
        self.b.ins().store(flags, stride, args, COLUMN_ARGS_STRIDE);
        self.b.ins().store(flags, rows, args, COLUMN_ARGS_ROWS);
        self.b.ins().store(flags, out, args, COLUMN_ARGS_OUT);
        self.b
            .ins()
            .store(flags, columns, args, COLUMN_ARGS_COLUMNS);
        let mut sig = Signature::new(self.b.func.signature.call_conv);
        sig.params.push(AbiParam::new(types::I64));
        let sig = self.b.import_signature(sig);
        let callee = self.b.ins().iconst(types::I64, routine as usize as i64);
        self.b.ins().call_indirect(sig, callee, &[args]);
        self.forget();
        out
    }

    /// The current group's sums from a column routine's call (`sums`: the address of its
    /// buffer and its first column): a vector of each slot's sums.
    fn group_sums(&mut self, (sums, first): (Value, Value)) -> Vec<Value> {
        let column = self.vars[&self.innermost.expect("the column variable")];
        let offset = self.b.ins().isub(column, first);
        let bytes = self.b.ins().ishl_imm_u(offset, 2);
        let at = self.b.ins().iadd(sums, bytes);
        let results = (0..OUTER_SLOTS)
            .map(|k| {
                let v = self
                    .b
                    .ins()
                    .load(types::F32X4, self.flags, at, (16 * k) as i32);
                self.pin(v)
            })
            .collect();
        self.forget();
        results
    }

    /// `acc` combined with the stage's value at the current column (`product`: see
    /// [`Self::summed_product`]).
    fn reduce_step(
        &mut self,
        op: ReduceOp,
        value: ExprId,
        product: Option<(ExprId, ExprId)>,
        acc: Value,
        mode: Mode,
    ) -> Value {
        if let Some((a, c)) = product {
            let (a, c) = self.f32_operands(a, c, mode);
            return self.b.ins().fma(a, c, acc);
        }
        let x = self.emit(value, mode);
        let x = match mode {
            Mode::Vector => self.vector_of(x, ScalarType::F32),
            Mode::Scalar => self.scalar_of(x),
        };
        match op {
            ReduceOp::Sum => self.b.ins().fadd(acc, x),
            ReduceOp::Max | ReduceOp::Min => self.extreme(op, acc, x),
        }
    }

    /// A max (min) step that keeps NaN: `x` replaces `acc` where `acc < x` (`acc > x`) or `x` is
    /// NaN, so a NaN, once in, stays (no comparison with it is true). The same for f32x4 lanes
    /// and scalars.
    fn extreme(&mut self, op: ReduceOp, acc: Value, x: Value) -> Value {
        let cc = if op == ReduceOp::Max {
            FloatCC::LessThan
        } else {
            FloatCC::GreaterThan
        };
        let better = self.b.ins().fcmp(cc, acc, x);
        let nan = self.b.ins().fcmp(FloatCC::Unordered, x, x);
        let take = self.b.ins().bor(better, nan);
        if self.b.func.dfg.value_type(acc).is_vector() {
            let take = self.bitcast(types::F32X4, take);
            self.b.ins().bitselect(take, x, acc)
        } else {
            self.b.ins().select(take, x, acc)
        }
    }

    /// A reduction stage's element stores at the current column.
    fn reduce_stores(&mut self, stores: &[Store], mode: Mode) {
        for st in stores {
            let v = self.emit(st.value, mode);
            self.store(st, v, mode);
        }
    }

    /// A store stage's stores at the current column: every value before any store (one may
    /// overwrite in place an element that a later value loads).
    fn store_all(&mut self, stores: &[Store], mode: Mode) {
        let values: Vec<Val> = stores.iter().map(|st| self.emit(st.value, mode)).collect();
        for (st, v) in stores.iter().zip(values) {
            self.store(st, v, mode);
        }
    }

    /// The stage's loops from `level` in, one row at a time; with `blocks` (a sum's reset and
    /// fold), the innermost loop runs in blocks of [`OUTER_SUM_BLOCK`] rows, resetting the
    /// accumulators before each block and folding them into the running sums after it; with
    /// `math`, in math blocks of rows inside those (see [`Self::math_rows`]).
    fn outer_rows(
        &mut self,
        level: usize,
        extents: &[Value],
        blocks: Option<RowBlocks<Self>>,
        math: Option<MathRows>,
        body: &mut dyn FnMut(&mut Self),
    ) {
        if extents.is_empty() {
            self.forget();
            body(self);
            self.forget();
            return;
        }
        if level + 1 < extents.len() {
            self.enclosing_loop(level, extents, |l| {
                l.outer_rows(level + 1, extents, blocks, math, body)
            });
            return;
        }
        let zero = self.b.ins().iconst(types::I64, 0);
        let var = Var::Inner(level as u32);
        match blocks {
            Some((reset, fold)) => {
                self.block_loop(zero, extents[level], OUTER_SUM_BLOCK, |l, start, end| {
                    reset(l);
                    l.math_rows(var, start, end, math, body);
                    fold(l);
                });
            }
            None => self.math_rows(var, zero, extents[level], math, body),
        }
    }

    /// Rows `lo..hi` of the innermost row loop `var`, one at a time; with `math`, in blocks of
    /// `MATH_BLOCK / width` rows (which divides [`OUTER_SUM_BLOCK`], so a sum's blocks are
    /// unchanged): for each level of functions, one pass puts their arguments at every row
    /// and column of the block into the block buffers (row after row, `width` columns each),
    /// one call per function turns them into results, and the body reads those.
    fn math_rows(
        &mut self,
        var: Var,
        lo: Value,
        hi: Value,
        math: Option<MathRows>,
        body: &mut dyn FnMut(&mut Self),
    ) {
        let Some((levels, columns)) = math else {
            self.counted_loop(lo, hi, 1, |l, i| {
                l.vars.insert(var, i);
                body(l);
            });
            return;
        };
        let width = columns.len() as i64 * LANES;
        let rows = MATH_BLOCK / width;
        debug_assert!(rows >= 1 && OUTER_SUM_BLOCK % rows == 0);
        self.block_loop(lo, hi, rows, |l, start, end| {
            l.block_start = Some(start);
            l.block_row = Some((var, width));
            for functions in levels {
                l.counted_loop(start, end, 1, |l, i| {
                    l.vars.insert(var, i);
                    for &column in columns {
                        l.enter_column(column, Mode::Vector);
                        for m in functions {
                            let v = l.emit(m.arg, Mode::Vector);
                            l.store_block(m.buffer, v, Mode::Vector);
                        }
                    }
                });
                let count = l.b.ins().isub(end, start);
                let n = l.b.ins().imul_imm_s(count, width);
                for m in functions {
                    l.call_block(m, m.buffer, n);
                    l.block_values.insert(m.expr, m.buffer);
                }
            }
            l.counted_loop(start, end, 1, |l, i| {
                l.vars.insert(var, i);
                body(l);
            });
            l.block_values.clear();
            l.block_start = None;
            l.block_row = None;
        });
    }

    fn scalar_of(&mut self, v: Val) -> Value {
        match v {
            Val::Scalar(x) => x,
            Val::Vector(_) => unreachable!("scalar mode yields scalars"),
        }
    }

    /// Stage `n`'s result for the current column, as a scalar (its lane, in a vector group).
    pub(super) fn outer_result_scalar(&mut self, n: u32) -> Value {
        let v = self.outer_results[n as usize][self.column.slot];
        match (v, self.column.lane) {
            (Val::Scalar(x), _) => x,
            (Val::Vector(x), Some(lane)) => self.b.ins().extractlane(x, lane),
            (Val::Vector(_), None) => unreachable!("a vector result is read per lane"),
        }
    }

    /// Stage `n`'s result for the current slot, as a vector.
    pub(super) fn outer_result_vector(&mut self, n: u32) -> Value {
        match self.outer_results[n as usize][self.column.slot] {
            Val::Vector(x) => x,
            Val::Scalar(x) => self.b.ins().splat(types::F32X4, x),
        }
    }
}
