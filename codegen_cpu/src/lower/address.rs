//! Addressing: byte addresses of loads and stores from affine indices, their loop-invariant parts
//! hoisted, symbolic coefficients computed once.

use super::*;

impl Lowering<'_, '_, '_> {
    /// Every (buffer, index) the stage loads (without a data-dependent part) or stores.
    pub(super) fn address_sites(&self, stage: &Stage) -> Vec<(BufferId, Affine)> {
        let mut sites: Vec<(BufferId, Affine)> = stage
            .action
            .stores()
            .iter()
            .map(|st| (st.buffer, st.index.clone()))
            .collect();
        let mut stack = stage.action.roots();
        let mut seen = std::collections::HashSet::new();
        while let Some(e) = stack.pop() {
            if !seen.insert(e) {
                continue;
            }
            match self.kernel.expr(e) {
                Expr::Load {
                    buffer,
                    index,
                    indirect,
                } => {
                    sites.push((*buffer, index.clone()));
                    if let Some(ind) = indirect {
                        stack.push(ind.value);
                    }
                }
                other => stack.extend(other.operands()),
            }
        }
        sites
    }

    /// `index` without its innermost-variable term, and that term's coefficient.
    pub(super) fn split_inner(&self, index: &Affine) -> (Affine, SizeExpr) {
        match self.innermost {
            Some(inner) if index.uses(inner) => {
                let mut invariant = index.clone();
                invariant.terms.retain(|(v, _)| *v != inner);
                (invariant, index.coefficient(inner))
            }
            _ => (index.clone(), SizeExpr::Const(0)),
        }
    }

    /// `v · c · k`, for a size expression `c` (a number, or computed in the entry block).
    pub(super) fn scaled(&mut self, v: Value, c: &SizeExpr, k: i64) -> Value {
        match c.as_const() {
            Some(c) => self.b.ins().imul_imm_s(v, c * k),
            None => {
                let ck = self.symbolic_times(c, k);
                self.b.ins().imul(v, ck)
            }
        }
    }

    /// `c · k` for a symbolic size expression `c` (computed in the entry block).
    pub(super) fn symbolic_times(&mut self, c: &SizeExpr, k: i64) -> Value {
        let c = self.sizes[c];
        if k == 1 {
            c
        } else {
            self.b.ins().imul_imm_s(c, k)
        }
    }

    /// `x + c · k` for a size expression `c`.
    pub(super) fn add_scaled(&mut self, x: Value, c: &SizeExpr, k: i64) -> Value {
        match c.as_const() {
            Some(0) => x,
            Some(c) => self.b.ins().iadd_imm_s(x, c * k),
            None => {
                let ck = self.symbolic_times(c, k);
                self.b.ins().iadd(x, ck)
            }
        }
    }

    /// `base(buffer) + index` in bytes, for an index without the innermost variable.
    pub(super) fn invariant_address(&mut self, buffer: BufferId, index: &Affine) -> Value {
        if let Some(&a) = self.hoisted.get(&(buffer, index.clone())) {
            return a;
        }
        let size = self.program.buffer(buffer).dtype.size_bytes() as i64;
        let mut address = self.bases[&buffer];
        for (var, coef) in &index.terms {
            let v = self.vars[var];
            let scaled = self.scaled(v, coef, size);
            address = self.b.ins().iadd(address, scaled);
        }
        self.add_scaled(address, &index.offset, size)
    }

    /// Computes the loop-invariant part of every address of the current stage, here (before
    /// its innermost loop), for `address` to use inside the loop.
    pub(super) fn hoist_addresses(&mut self) {
        self.hoisted.clear();
        for (buffer, index) in std::mem::take(&mut self.sites) {
            let (invariant, _) = self.split_inner(&index);
            if !self.hoisted.contains_key(&(buffer, invariant.clone())) {
                let a = self.invariant_address(buffer, &invariant);
                let a = self.pin(a);
                self.hoisted.insert((buffer, invariant.clone()), a);
            }
            self.sites.push((buffer, index));
        }
    }

    /// Address of element `index` (+ `lane` and the unroll slot's offset along the innermost
    /// var) of `buffer`.
    pub(super) fn address(
        &mut self,
        buffer: BufferId,
        index: &Affine,
        indirect: Option<&Indirect>,
        lane: i64,
    ) -> Value {
        let size = self.program.buffer(buffer).dtype.size_bytes() as i64;
        let (invariant, coef) = self.split_inner(index);
        let mut address = self.invariant_address(buffer, &invariant);
        if !coef.is_zero() {
            let inner = self
                .innermost
                .expect("a coefficient implies an innermost var");
            let v = self.vars[&inner];
            let scaled = self.scaled(v, &coef, size);
            address = self.b.ins().iadd(address, scaled);
            let lane = lane + self.lane_offset;
            if lane != 0 {
                address = self.add_scaled(address, &coef, lane * size);
            }
        }
        if let Some(ind) = indirect {
            // Clamp the data-dependent index into the table: JIT code never reads outside a buffer.
            let i = self.scalar_operand(ind.value);
            let zero = self.b.ins().iconst(types::I64, 0);
            let last = match ind.bound.as_const() {
                Some(bound) => self.b.ins().iconst(types::I64, bound - 1),
                None => {
                    let bound = self.sizes[&ind.bound];
                    self.b.ins().iadd_imm_s(bound, -1)
                }
            };
            let i = self.b.ins().smax(i, zero);
            let i = self.b.ins().smin(i, last);
            let scaled = self.b.ins().imul_imm_s(i, ind.stride * size);
            address = self.b.ins().iadd(address, scaled);
        }
        address
    }

    /// The i64 value of `index` at the current loop variables (lane 0 of the unroll slot).
    pub(super) fn index_value(&mut self, index: &Affine) -> Value {
        let zero = self.b.ins().iconst(types::I64, 0);
        let mut acc = self.add_scaled(zero, &index.offset, 1);
        for (var, coef) in &index.terms {
            let v = self.vars[var];
            let scaled = self.scaled(v, coef, 1);
            acc = self.b.ins().iadd(acc, scaled);
            if Some(*var) == self.innermost && self.lane_offset != 0 {
                acc = self.add_scaled(acc, coef, self.lane_offset);
            }
        }
        acc
    }
}
