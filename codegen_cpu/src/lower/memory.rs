//! Loads, stores and casts: element types in memory (f64, f16, bf16, bool, i64) to and from the
//! f32, i64 and bool values kernels compute in.

use super::*;

impl Lowering<'_, '_, '_> {
    pub(super) fn load_scalar(&mut self, buffer: BufferId, addr: Value) -> Value {
        let f = self.flags;
        match self.program.buffer(buffer).dtype {
            DType::F32 => self.b.ins().load(types::F32, f, addr, 0),
            // Kernels compute floats in f32 (`fuse` refuses f64 graphs; this keeps lowering total).
            DType::F64 => {
                let wide = self.b.ins().load(types::F64, f, addr, 0);
                self.b.ins().fdemote(types::F32, wide)
            }
            DType::F16 => {
                let bits = self.b.ins().uload16(types::I32, f, addr, 0);
                emit_f16_to_f32(self.b, bits)
            }
            DType::BF16 => {
                let bits = self.b.ins().uload16(types::I32, f, addr, 0);
                emit_bf16_to_f32(self.b, bits)
            }
            DType::I64 => self.b.ins().load(types::I64, f, addr, 0),
            DType::Bool => {
                let byte = self.b.ins().load(types::I8, f, addr, 0);
                self.b.ins().icmp_imm_s(IntCC::NotEqual, byte, 0)
            }
        }
    }

    pub(super) fn cast_scalar(&mut self, to: DType, from: ScalarType, a: Value) -> Value {
        match (to, from) {
            (DType::F64 | DType::F32 | DType::F16 | DType::BF16, ScalarType::I64) => {
                let f = self.b.ins().fcvt_from_sint(types::F32, a);
                self.round_to(to, f)
            }
            (DType::F64 | DType::F32 | DType::F16 | DType::BF16, ScalarType::Bool) => {
                let one = self.b.ins().f32const(1.0);
                let zero = self.b.ins().f32const(0.0);
                self.b.ins().select(a, one, zero)
            }
            (DType::F64 | DType::F32 | DType::F16 | DType::BF16, ScalarType::F32) => {
                self.round_to(to, a)
            }
            (DType::I64, ScalarType::F32) => self.b.ins().fcvt_to_sint_sat(types::I64, a),
            (DType::I64, ScalarType::Bool) => self.b.ins().uextend(types::I64, a),
            (DType::I64, ScalarType::I64) => a,
            (DType::Bool, ScalarType::F32) => {
                let zero = self.b.ins().f32const(0.0);
                self.b.ins().fcmp(FloatCC::NotEqual, a, zero)
            }
            (DType::Bool, ScalarType::I64) => self.b.ins().icmp_imm_s(IntCC::NotEqual, a, 0),
            (DType::Bool, ScalarType::Bool) => a,
        }
    }

    /// Rounds an f32 (scalar or vector) to the value set of `to`.
    pub(super) fn round_to(&mut self, to: DType, x: Value) -> Value {
        match to {
            DType::F16 => {
                let bits = emit_f32_to_f16_bits(self.b, x);
                emit_f16_to_f32(self.b, bits)
            }
            DType::BF16 => {
                let bits = emit_f32_to_bf16_bits(self.b, x);
                emit_bf16_to_f32(self.b, bits)
            }
            _ => x,
        }
    }

    /// `x` (a vector of kernel type `from`) cast to `to`, lane by lane (`vectorizable` keeps
    /// i64 casts scalar).
    pub(super) fn cast_vector(&mut self, to: DType, from: ScalarType, x: Value) -> Value {
        match (to, from) {
            (DType::F32 | DType::F16 | DType::BF16, ScalarType::F32) => self.round_to(to, x),
            (DType::F64 | DType::F32 | DType::F16 | DType::BF16, ScalarType::Bool) => {
                let one = self.f32_like(1.0, types::F32X4);
                let mask = self.bitcast(types::F32X4, x);
                self.b.ins().band(mask, one)
            }
            (DType::Bool, ScalarType::F32) => {
                let zero = self.f32_like(0.0, types::F32X4);
                let m = self.b.ins().fcmp(FloatCC::NotEqual, x, zero);
                self.bitcast(types::I32X4, m)
            }
            (DType::Bool, ScalarType::Bool) => x,
            _ => unreachable!("vectorizable() excludes i64 casts"),
        }
    }

    pub(super) fn load_vector(
        &mut self,
        buffer: BufferId,
        index: &Affine,
        indirect: Option<&Indirect>,
    ) -> Value {
        let inner = self.innermost.expect("vector mode has an innermost loop");
        let dtype = self.program.buffer(buffer).dtype;
        let addr = self.address(buffer, index, indirect, 0);
        if index.coefficient(inner).is(1) {
            let f = self.flags;
            match dtype {
                DType::F32 => return self.b.ins().load(types::F32X4, f, addr, 0),
                DType::F16 | DType::BF16 => {
                    let bits = self.b.ins().uload16x4(f, addr, 0);
                    let bits = self.bitcast(types::I32X4, bits);
                    return if dtype == DType::F16 {
                        emit_f16_to_f32(self.b, bits)
                    } else {
                        emit_bf16_to_f32(self.b, bits)
                    };
                }
                _ => unreachable!("vectorizable() admits float buffers only"),
            }
        }
        // Strided: gather the four lanes.
        let mut v = None;
        for lane in 0..LANES {
            let a = self.address(buffer, index, indirect, lane);
            let x = self.load_scalar(buffer, a);
            v = Some(match v {
                None => self.b.ins().scalar_to_vector(types::F32X4, x),
                Some(acc) => self.b.ins().insertlane(acc, x, lane as u8),
            });
        }
        v.unwrap()
    }

    pub(super) fn store(&mut self, st: &Store, v: Val, mode: Mode) {
        if let Some(buffer) = self.block_store(st) {
            // Narrowed a block at a time after the body (`Conversion`).
            self.store_block(buffer, v, mode);
            return;
        }
        let dtype = self.program.buffer(st.buffer).dtype;
        let f = self.flags;
        if mode == Mode::Scalar || !dtype.is_float() {
            let x = match v {
                Val::Scalar(x) => x,
                Val::Vector(_) => unreachable!("non-float stores run scalar"),
            };
            let addr = self.address(st.buffer, &st.index, None, 0);
            self.store_scalar(dtype, x, addr);
            return;
        }
        let inner = self.innermost.expect("vector mode has an innermost loop");
        let x = self.vector_of(v, ScalarType::F32);
        if st.index.coefficient(inner).is(1) {
            let addr = self.address(st.buffer, &st.index, None, 0);
            match dtype {
                DType::F32 => {
                    self.b.ins().store(f, x, addr, 0);
                }
                DType::F16 | DType::BF16 => {
                    let bits = self.half_bits(dtype, x);
                    let packed = self.b.ins().unarrow(bits, bits);
                    let wide = self.bitcast(types::I64X2, packed);
                    let low = self.b.ins().extractlane(wide, 0);
                    self.b.ins().store(f, low, addr, 0);
                }
                _ => unreachable!(),
            }
            return;
        }
        for lane in 0..LANES {
            let addr = self.address(st.buffer, &st.index, None, lane);
            let s = self.b.ins().extractlane(x, lane as u8);
            self.store_scalar(dtype, s, addr);
        }
    }

    /// The f16 or bf16 (`dtype`) bits of f32 `x`, scalar or vector.
    pub(super) fn half_bits(&mut self, dtype: DType, x: Value) -> Value {
        if dtype == DType::F16 {
            emit_f32_to_f16_bits(self.b, x)
        } else {
            emit_f32_to_bf16_bits(self.b, x)
        }
    }

    pub(super) fn store_scalar(&mut self, dtype: DType, x: Value, addr: Value) {
        let f = self.flags;
        match dtype {
            DType::F32 | DType::I64 => {
                self.b.ins().store(f, x, addr, 0);
            }
            DType::F64 => {
                let wide = self.b.ins().fpromote(types::F64, x);
                self.b.ins().store(f, wide, addr, 0);
            }
            DType::F16 | DType::BF16 => {
                let bits = self.half_bits(dtype, x);
                self.b.ins().istore16(f, bits, addr, 0);
            }
            DType::Bool => {
                let byte = self.b.ins().uextend(types::I32, x);
                self.b.ins().istore8(f, byte, addr, 0);
            }
        }
    }
}
