//! Loop nests: the outer loops a thread's range covers, each stage's loops (vector body, unrolled,
//! scalar tail), block loops, and what is hoisted out of them.

use super::*;

impl Lowering<'_, '_, '_> {
    pub(super) fn outer_loops(
        &mut self,
        level: usize,
        start: Value,
        end: Value,
        extents: &[Value],
    ) {
        let outer = self.kernel.outer.len();
        if level == outer {
            self.stages(&extents[outer..]);
            return;
        }
        if level == 0 && self.split > 1 {
            match self.transposed.clone() {
                Some(copy) if self.split == outer => {
                    self.last_loop_runs(start, end, extents, |l, lo, hi| {
                        l.transpose_call(&copy, lo, hi, extents)
                    })
                }
                _ if self.row_runs && self.split == outer => {
                    self.last_loop_runs(start, end, extents, |l, lo, hi| {
                        l.row_run_calls(lo, hi, extents)
                    })
                }
                _ => self.flat_loops(start, end, extents),
            }
            return;
        }
        let (lo, hi) = if level == 0 {
            (start, end)
        } else {
            (self.b.ins().iconst(types::I64, 0), extents[level])
        };
        if let (Some(copy), true) = (self.transposed.clone(), level + 1 == outer) {
            // The whole run of the last loop in one call of the transpose routine.
            self.transpose_call(&copy, lo, hi, extents);
            return;
        }
        if self.row_runs && level + 1 == outer {
            // The whole run of the last loop in one call per row plan.
            self.row_run_calls(lo, hi, extents);
            return;
        }
        self.counted_loop(lo, hi, 1, |l, i| {
            l.vars.insert(Var::Outer(level as u32), i);
            l.outer_loops(level + 1, start, end, extents);
        });
    }

    /// The first `split` outer loops as one loop over their flattened iterations `start..end`:
    /// the variables start at `start`'s mixed-radix digits (one division per digit, per call)
    /// and advance like an odometer, the last fastest; the deeper loops run inside.
    fn flat_loops(&mut self, start: Value, end: Value, extents: &[Value]) {
        let split = self.split;
        let digits: Vec<Variable> = (0..split).map(|_| self.b.declare_var(types::I64)).collect();
        for (&var, digit) in digits.iter().zip(self.digits(start, &extents[..split])) {
            self.b.def_var(var, digit);
        }
        self.counted_loop(start, end, 1, |l, _| {
            for (j, &d) in digits.iter().enumerate() {
                let v = l.b.use_var(d);
                l.vars.insert(Var::Outer(j as u32), v);
            }
            l.outer_loops(split, start, end, extents);
            // Advance: the last digit by one, a carry into each digit whose right neighbour
            // wrapped to 0.
            let mut carry = l.b.ins().iconst(types::I64, 1);
            for j in (0..split).rev() {
                let v = l.b.use_var(digits[j]);
                let next = l.b.ins().iadd(v, carry);
                if j == 0 {
                    l.b.def_var(digits[j], next);
                } else {
                    let wrapped = l.b.ins().icmp(IntCC::Equal, next, extents[j]);
                    let zero = l.b.ins().iconst(types::I64, 0);
                    let digit = l.b.ins().select(wrapped, zero, next);
                    l.b.def_var(digits[j], digit);
                    carry = l.b.ins().uextend(types::I64, wrapped);
                }
            }
        });
    }

    /// The mixed-radix digits of the flattened iteration `i` over loops of `extents` (the last
    /// fastest): one division per digit. A zero extent makes the range empty; the divisors are
    /// kept at least 1 regardless.
    pub(super) fn digits(&mut self, i: Value, extents: &[Value]) -> Vec<Value> {
        let one = self.b.ins().iconst(types::I64, 1);
        let mut rest = i;
        let mut digits = vec![i; extents.len()];
        for j in (1..extents.len()).rev() {
            let n = self.b.ins().umax(extents[j], one);
            digits[j] = self.b.ins().urem(rest, n);
            rest = self.b.ins().udiv(rest, n);
        }
        digits[0] = rest;
        digits
    }

    /// `for i in (lo..hi).step_by(step)` where the body runs only while `i + step <= hi`.
    /// Returns the first `i` the body did not run for.
    pub(super) fn counted_loop(
        &mut self,
        lo: Value,
        hi: Value,
        step: i64,
        mut body: impl FnMut(&mut Self, Value),
    ) -> Value {
        let head = self.loop_head(lo);
        let next = self.b.ins().iadd_imm_s(head.i, step);
        let go = self.b.ins().icmp(IntCC::SignedLessThanOrEqual, next, hi);
        self.b.ins().brif(go, head.body, &[], head.exit, &[]);
        self.b.switch_to_block(head.body);
        self.forget();
        body(self, head.i);
        self.forget();
        let i = self.b.use_var(head.var);
        let next = self.b.ins().iadd_imm_s(i, step);
        self.loop_tail(&head, next);
        self.b.use_var(head.var)
    }

    /// The head of a loop over an i64 variable starting at `lo`: its header, body and exit
    /// blocks, with the builder left in the header, where the variable's value is `i`.
    pub(super) fn loop_head(&mut self, lo: Value) -> LoopHead {
        let var = self.b.declare_var(types::I64);
        self.b.def_var(var, lo);
        let header = self.b.create_block();
        let body = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().jump(header, &[]);
        self.b.switch_to_block(header);
        let i = self.b.use_var(var);
        LoopHead {
            var,
            header,
            body,
            exit,
            i,
        }
    }

    /// The end of a loop's body: the variable takes `next`, back to the header; the builder
    /// continues after the loop.
    pub(super) fn loop_tail(&mut self, head: &LoopHead, next: Value) {
        self.b.def_var(head.var, next);
        self.b.ins().jump(head.header, &[]);
        self.b.switch_to_block(head.exit);
    }

    /// A stage loop above the innermost: `Var::Inner(level)` over `0..extents[level]`, `deeper`
    /// inside (both stage loop orders nest their levels this way).
    pub(super) fn enclosing_loop(
        &mut self,
        level: usize,
        extents: &[Value],
        mut deeper: impl FnMut(&mut Self),
    ) {
        let zero = self.b.ins().iconst(types::I64, 0);
        let var = Var::Inner(level as u32);
        self.counted_loop(zero, extents[level], 1, |l, i| {
            l.vars.insert(var, i);
            deeper(l);
        });
    }

    pub(super) fn stages(&mut self, extents: &[Value]) {
        // A stash is made and taken within one emission of the stages.
        self.stash = None;
        let mut offset = 0;
        for (n, stage) in self.kernel.stages.iter().enumerate() {
            let ext = &extents[offset..offset + stage.extent.len()];
            offset += stage.extent.len();
            self.stage(n, stage, ext);
        }
        self.stage_results.iter_mut().for_each(|r| *r = None);
    }

    pub(super) fn stage(&mut self, n: usize, stage: &Stage, extents: &[Value]) {
        self.conversions.clear();
        self.row_extent = match stage.extent.as_slice() {
            [d] => d.as_static(),
            _ => None,
        };
        let depth = extents.len();
        self.innermost = if depth == 0 {
            None
        } else {
            Some(Var::Inner(depth as u32 - 1))
        };
        let plans = self.row_plans(stage);
        assert!(
            plans.is_some() || self.row_run.is_none(),
            "a row run's stage has its plans (`choose_row_runs` asked in the same context)"
        );
        if plans.is_none() {
            // A loop stage may write any buffer: no widened row is known to be current.
            self.forget_half_rows(None);
            self.stash = None;
        }
        if let Some(mut plans) = plans {
            self.stash_plans(n, &mut plans);
            self.stage_bits[n] = Some(Self::row_bits());
            self.stage_streams[n] = plans.iter().any(|p| p.streams());
            for plan in &plans {
                self.row_call(n, plan, extents[0]);
            }
            self.hoisted.clear();
            return;
        }
        let vector = depth > 0 && self.vectorizable(stage);
        self.stage_bits[n] = (depth > 0).then_some(if vector { 128 } else { 32 });
        (self.block_levels, self.conversions) = if vector {
            (self.block_math(stage), self.conversions(stage))
        } else {
            (Vec::new(), Vec::new())
        };
        self.direct_store = self.direct_store(stage);
        self.sites = self.address_sites(stage);
        self.stage_roots = stage.action.roots();
        match &stage.action {
            StageAction::Reduce { op, value, stores } => {
                let (op, value) = (*op, *value);
                let scalar_acc = self.b.declare_var(types::F32);
                let c = self.reduce_init(op, types::F32);
                self.b.def_var(scalar_acc, c);
                let v = self.b.ins().splat(types::F32X4, c);
                let vector_accs: Vec<_> = (0..UNROLL)
                    .map(|_| {
                        let acc = self.b.declare_var(types::F32X4);
                        self.b.def_var(acc, v);
                        acc
                    })
                    .collect();
                // Vector max/min use a compare and select (one `maxps`/`minps`, which drops a NaN
                // `x`) and note NaN lanes in this mask, instead of the 8-instruction NaN-exact
                // `fmax`/`fmin`; the result is NaN if any lane saw one, as with `fmax`.
                let nan_lanes = self.b.declare_var(types::I32X4);
                let zero = self.b.ins().iconst(types::I32, 0);
                let none = self.b.ins().splat(types::I32X4, zero);
                self.b.def_var(nan_lanes, none);
                // (A stage without loops has nothing to block.)
                if op == ReduceOp::Sum && depth > 0 {
                    let slot = self.b.create_sized_stack_slot(StackSlotData::new(
                        StackSlotKind::ExplicitSlot,
                        Fold::BYTES,
                        4,
                    ));
                    let sums = self.b.ins().stack_addr(types::I64, slot, 0);
                    for k in 0..UNROLL {
                        for comp in [false, true] {
                            self.b
                                .ins()
                                .store(self.flags, v, sums, Fold::offset(k, comp));
                        }
                    }
                    for comp in [false, true] {
                        self.b
                            .ins()
                            .store(self.flags, c, sums, Fold::offset(UNROLL, comp));
                    }
                    self.fold = Some(Fold {
                        block: vector_accs.clone(),
                        block_scalar: scalar_acc,
                        sums,
                    });
                }
                // In the unrolled loop, one unordered compare covers two slots' vectors (it is
                // true where either lane is NaN): even slots leave theirs here for the next.
                const { assert!(UNROLL.is_multiple_of(2)) };
                let mut unpaired: Option<Value> = None;
                let product = self.summed_product(op, value);
                self.inner_loops(0, extents, vector, &mut |l, mode, slot| {
                    if let Some((a, c)) = product {
                        let (a, c) = l.f32_operands(a, c, mode);
                        let var = match mode {
                            Mode::Vector => vector_accs[slot],
                            Mode::Scalar => scalar_acc,
                        };
                        let acc = l.b.use_var(var);
                        let r = l.b.ins().fma(a, c, acc);
                        l.b.def_var(var, r);
                        for st in stores {
                            let v = l.emit(st.value, mode);
                            l.store(st, v, mode);
                        }
                        return;
                    }
                    let x = l.emit(value, mode);
                    for st in stores {
                        let v = l.emit(st.value, mode);
                        l.store(st, v, mode);
                    }
                    match (mode, x) {
                        (Mode::Vector, x) => {
                            let x = l.vector_of(x, ScalarType::F32);
                            let acc = l.b.use_var(vector_accs[slot]);
                            let r = if op == ReduceOp::Sum {
                                l.b.ins().fadd(acc, x)
                            } else {
                                let cc = if op == ReduceOp::Max {
                                    FloatCC::LessThan
                                } else {
                                    FloatCC::GreaterThan
                                };
                                let take = l.b.ins().fcmp(cc, acc, x);
                                let take = l.bitcast(types::F32X4, take);
                                let other = match (l.unrolled, slot % 2, unpaired.take()) {
                                    (true, 0, _) => {
                                        unpaired = Some(x);
                                        None
                                    }
                                    (true, _, Some(prev)) => Some(prev),
                                    _ => Some(x),
                                };
                                if let Some(other) = other {
                                    let nan = l.b.ins().fcmp(FloatCC::Unordered, other, x);
                                    let seen = l.b.use_var(nan_lanes);
                                    let seen = l.b.ins().bor(seen, nan);
                                    l.b.def_var(nan_lanes, seen);
                                }
                                l.b.ins().bitselect(take, x, acc)
                            };
                            l.b.def_var(vector_accs[slot], r);
                        }
                        (Mode::Scalar, Val::Scalar(x)) | (Mode::Scalar, Val::Vector(x)) => {
                            let acc = l.b.use_var(scalar_acc);
                            let r = l.combine(op, acc, x);
                            l.b.def_var(scalar_acc, r);
                        }
                    }
                });
                let (mut accs, scalar): (Vec<Value>, Value) = match self.fold.take() {
                    Some(fold) => {
                        let flags = self.flags;
                        let accs = (0..UNROLL)
                            .map(|k| {
                                let at = Fold::offset(k, false);
                                self.b.ins().load(types::F32X4, flags, fold.sums, at)
                            })
                            .collect();
                        let at = Fold::offset(UNROLL, false);
                        (accs, self.b.ins().load(types::F32, flags, fold.sums, at))
                    }
                    None => (
                        vector_accs.iter().map(|&a| self.b.use_var(a)).collect(),
                        self.b.use_var(scalar_acc),
                    ),
                };
                // Fixed combine order: a pairwise tree over the unrolled accumulators, then
                // over the lanes, then the scalar tail.
                while accs.len() > 1 {
                    accs = accs
                        .chunks(2)
                        .map(|pair| match pair {
                            [a, c] => self.combine(op, *a, *c),
                            [a] => *a,
                            _ => unreachable!(),
                        })
                        .collect();
                }
                let acc = accs[0];
                let lanes: Vec<Value> = (0..4)
                    .map(|i| self.b.ins().extractlane(acc, i as u8))
                    .collect();
                let lo = self.combine(op, lanes[0], lanes[1]);
                let hi = self.combine(op, lanes[2], lanes[3]);
                let v = self.combine(op, lo, hi);
                let result = self.combine(op, v, scalar);
                let result = if op == ReduceOp::Sum {
                    result
                } else {
                    let seen = self.b.use_var(nan_lanes);
                    let any = self.b.ins().vany_true(seen);
                    let nan = self.b.ins().f32const(f32::NAN);
                    self.b.ins().select(any, nan, result)
                };
                self.stage_results[n] = Some(self.pin(result));
            }
            StageAction::Scan(store) if self.kernel.ty(store.value) == ScalarType::I64 => {
                // An integer scan: an i64 running sum (wrapping on overflow, as PyTorch's).
                let acc = self.b.declare_var(types::I64);
                let zero = self.b.ins().iconst(types::I64, 0);
                self.b.def_var(acc, zero);
                self.inner_loops(0, extents, false, &mut |l, _, _| {
                    let x = l.scalar_operand(store.value);
                    let sum = l.b.use_var(acc);
                    let sum = l.b.ins().iadd(sum, x);
                    l.b.def_var(acc, sum);
                    l.store(store, Val::Scalar(sum), Mode::Scalar);
                });
            }
            StageAction::Scan(store) => {
                // One element at a time, in order: the running sum lives in a variable, in f64
                // (as PyTorch's CPU cumsum accumulates floats in `acc_type`, double), each
                // stored element rounded once from it.
                let acc = self.b.declare_var(types::F64);
                let zero = self.b.ins().f64const(0.0);
                self.b.def_var(acc, zero);
                self.inner_loops(0, extents, false, &mut |l, _, _| {
                    let x = l.scalar_operand(store.value);
                    let x = l.b.ins().fpromote(types::F64, x);
                    let sum = l.b.use_var(acc);
                    let sum = l.b.ins().fadd(sum, x);
                    l.b.def_var(acc, sum);
                    let rounded = l.b.ins().fdemote(types::F32, sum);
                    l.store(store, Val::Scalar(rounded), Mode::Scalar);
                });
            }
            StageAction::Store(stores) => {
                self.inner_loops(0, extents, vector, &mut |l, mode, _| {
                    // Every value before any store: a store may overwrite in place an element
                    // that a later value still loads (math blocks hand a function's result over
                    // without evaluating its argument, so the argument's load can come after).
                    let values: Vec<Val> = stores.iter().map(|st| l.emit(st.value, mode)).collect();
                    for (st, v) in stores.iter().zip(values) {
                        l.store(st, v, mode);
                    }
                });
            }
        }
        self.hoisted.clear();
    }

    /// Loops over the stage's extents. The innermost runs `UNROLL` vectors per iteration, then
    /// one vector per iteration, then a scalar tail; `body` gets the mode and the unroll slot
    /// (`0..UNROLL`; the single-vector and scalar loops use slot 0).
    pub(super) fn inner_loops(
        &mut self,
        level: usize,
        extents: &[Value],
        vector: bool,
        body: &mut dyn FnMut(&mut Self, Mode, usize),
    ) {
        if extents.is_empty() {
            self.forget();
            body(self, Mode::Scalar, 0);
            self.forget();
            return;
        }
        if level + 1 < extents.len() {
            self.enclosing_loop(level, extents, |l| {
                l.inner_loops(level + 1, extents, vector, body)
            });
            return;
        }
        let zero = self.b.ins().iconst(types::I64, 0);
        let var = Var::Inner(level as u32);
        self.hoist_addresses();
        self.hoist_invariants();
        if !self.block_levels.is_empty() || self.fold.is_some() || !self.conversions.is_empty() {
            let levels = std::mem::take(&mut self.block_levels);
            let direct = self.direct_store.take();
            let direct = direct.as_ref();
            let fold = self.fold.clone();
            let conversions = self.conversions.clone();
            let step = if levels.is_empty() && fold.is_some() {
                SUM_BLOCK
            } else {
                MATH_BLOCK
            };
            self.block_loop(zero, extents[level], step, |l, start, end| {
                if let Some(fold) = &fold {
                    l.reset_block_sums(fold);
                }
                l.block_start = Some(start);
                // The block's f16 and bf16 loads widened into their block buffers.
                for c in conversions.iter().filter(|c| c.load.is_some()) {
                    l.convert_block(c, var, start, end);
                }
                for functions in &levels {
                    // Arguments into the block buffers, then the routines in place.
                    l.range_loops(var, start, end, true, &mut |l, mode, _| {
                        for m in functions {
                            let v = l.emit(m.arg, mode);
                            l.store_block(m.buffer, v, mode);
                        }
                    });
                    let n = l.b.ins().isub(end, start);
                    for m in functions {
                        if let Some(st) = direct.filter(|st| st.value == m.expr) {
                            // The routine writes the block's elements of the output itself.
                            l.vars.insert(var, start);
                            let dst = l.address(st.buffer, &st.index, None, 0);
                            l.call_block(m, dst, n);
                        } else {
                            l.call_block(m, m.buffer, n);
                            l.block_values.insert(m.expr, m.buffer);
                        }
                    }
                }
                if direct.is_none() {
                    l.range_loops(var, start, end, vector, body);
                }
                // The block's f16 and bf16 stores narrowed from their block buffers.
                for c in conversions.iter().filter(|c| c.load.is_none()) {
                    l.convert_block(c, var, start, end);
                }
                l.block_values.clear();
                l.block_start = None;
                if let Some(fold) = &fold {
                    l.add_block_sums(fold);
                }
            });
            self.block_levels = levels;
            self.direct_store = direct.cloned();
            self.drop_invariants();
            return;
        }
        self.range_loops(var, zero, extents[level], vector, body);
        self.drop_invariants();
    }

    /// Computes the stage's load-free values that do not vary along the innermost loop, here,
    /// before it (with the reciprocals of those that divide), for `emit` to reuse inside.
    pub(super) fn hoist_invariants(&mut self) {
        self.drop_invariants();
        let mut ids = self.kernel.reachable(&self.stage_roots);
        ids.sort_by_key(|e| e.0);
        for &e in &ids {
            let worth = matches!(
                self.kernel.expr(e),
                Expr::Unary(..)
                    | Expr::Binary(..)
                    | Expr::Compare(..)
                    | Expr::Where(..)
                    | Expr::Cast(..)
                    | Expr::StageResult(_)
            );
            if worth && self.load_free[e.0 as usize] && self.is_uniform(e) {
                let v = self.scalar_operand(e);
                let v = self.pin(v);
                self.invariants.insert(e, v);
            }
        }
        for &e in &ids {
            if let Expr::Binary(BinaryOp::Div, a, c) = *self.kernel.expr(e) {
                if self.divides_by_uniform(a, c, self.kernel.ty(e)) {
                    if let Some(&d) = self.invariants.get(&c) {
                        let one = self.b.ins().f32const(1.0);
                        let r = self.b.ins().fdiv(one, d);
                        let r = self.pin(r);
                        self.invariant_reciprocals.insert(c, r);
                    }
                }
            }
        }
        self.forget();
    }

    /// Forgets the values [`Self::hoist_invariants`] computed (they do not dominate the code
    /// after the loop they were computed for).
    pub(super) fn drop_invariants(&mut self) {
        self.invariants.clear();
        self.invariant_reciprocals.clear();
    }

    /// The innermost loop over `lo..hi`: `UNROLL` vectors per iteration, then one vector per
    /// iteration (when `vector`), then a scalar tail.
    pub(super) fn range_loops(
        &mut self,
        var: Var,
        lo: Value,
        hi: Value,
        vector: bool,
        body: &mut dyn FnMut(&mut Self, Mode, usize),
    ) {
        let tail_start = if vector {
            let unrolled_end = self.counted_loop(lo, hi, LANES * UNROLL as i64, |l, i| {
                l.vars.insert(var, i);
                l.unrolled = true;
                for slot in 0..UNROLL {
                    // Values uniform along the innermost loop are shared by the slots.
                    l.memo.retain(|_, v| matches!(v, Val::Scalar(_)));
                    l.lane_offset = slot as i64 * LANES;
                    body(l, Mode::Vector, slot);
                }
                l.unrolled = false;
                l.lane_offset = 0;
            });
            self.counted_loop(unrolled_end, hi, LANES, |l, i| {
                l.vars.insert(var, i);
                body(l, Mode::Vector, 0);
            })
        } else {
            lo
        };
        self.counted_loop(tail_start, hi, 1, |l, i| {
            l.vars.insert(var, i);
            body(l, Mode::Scalar, 0);
        });
    }

    /// `for start in (lo..hi).step_by(step)` with `end = min(start + step, hi)`: every element
    /// of `lo..hi` in one block, the last block possibly short.
    pub(super) fn block_loop(
        &mut self,
        lo: Value,
        hi: Value,
        step: i64,
        mut body: impl FnMut(&mut Self, Value, Value),
    ) {
        let head = self.loop_head(lo);
        let go = self.b.ins().icmp(IntCC::SignedLessThan, head.i, hi);
        self.b.ins().brif(go, head.body, &[], head.exit, &[]);
        self.b.switch_to_block(head.body);
        let next = self.b.ins().iadd_imm_s(head.i, step);
        let full = self.b.ins().icmp(IntCC::SignedLessThan, next, hi);
        let end = self.b.ins().select(full, next, hi);
        self.forget();
        body(self, head.i, end);
        self.forget();
        self.loop_tail(&head, next);
    }

    /// Forgets the values emitted so far (they do not dominate the code that follows).
    pub(super) fn forget(&mut self) {
        self.memo.clear();
        self.reciprocals.clear();
    }

    /// `x` passed through a stack slot, so that it is computed here, once. Cranelift's
    /// elaborator otherwise places pure instructions at their uses, and it would recompute a
    /// reduction's final combine (four branchy NaN-aware `fmax` for a max), a row's `1/sum` or
    /// `rsqrt(var)`, or a row's base address in every iteration of the (unrolled, vector and
    /// scalar) loops that use it: a division per 16 elements.
    pub(super) fn pin(&mut self, x: Value) -> Value {
        let ty = self.b.func.dfg.value_type(x);
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            ty.bytes(),
            ty.bytes().trailing_zeros() as u8,
        ));
        self.b.ins().stack_store(types::I64, x, slot, 0);
        self.b.ins().stack_load(types::I64, ty, slot, 0)
    }
}
