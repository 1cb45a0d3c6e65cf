//! Accuracy of the math algorithms (both forms) against f64 references.

pub(crate) mod testjit {
    //! A tiny JIT harness: compiles `fn(a: *const u32, b: *const u32, dst: *mut u32, n: i64)`
    //! that applies an emitter to 4 lanes at a time (vector body) and then to the tail
    //! (scalar), or only scalar.
    use cranelift_codegen::ir::{
        types, AbiParam, BlockArg, InstBuilder, MemFlagsData, Type, Value,
    };
    use cranelift_codegen::settings::{self, Configurable};
    use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
    use cranelift_jit::{JITBuilder, JITModule};
    use cranelift_module::{default_libcall_names, Linkage, Module};

    pub type KFn = unsafe extern "C" fn(*const u32, *const u32, *mut u32, i64);

    pub struct Kernel {
        _module: JITModule,
        f: KFn,
    }

    impl Kernel {
        /// Runs over `a` (and `b`, same length; pass `a` again for unary kernels).
        pub fn run(&self, a: &[u32], b: &[u32], out: &mut [u32]) {
            assert!(a.len() == b.len() && a.len() == out.len());
            // SAFETY: the kernel reads `a.len()` values of `a` and `b` and writes as many of
            // `out`, whose lengths were just checked equal; the module that owns it lives in `self`.
            unsafe { (self.f)(a.as_ptr(), b.as_ptr(), out.as_mut_ptr(), a.len() as i64) }
        }
        /// The compiled function (valid while `self` lives).
        pub fn raw(&self) -> KFn {
            self.f
        }
        pub fn run_f32(&self, a: &[f32], b: &[f32]) -> Vec<f32> {
            let mut out = vec![0u32; a.len()];
            let a: Vec<u32> = a.iter().map(|v| v.to_bits()).collect();
            let b: Vec<u32> = b.iter().map(|v| v.to_bits()).collect();
            self.run(&a, &b, &mut out);
            out.into_iter().map(f32::from_bits).collect()
        }
    }

    fn vec_of(lane: Type) -> Type {
        if lane == types::F32 {
            types::F32X4
        } else {
            types::I32X4
        }
    }

    /// `in_lane`/`out_lane` are `F32` or `I32`; `emit` gets the loaded `a` and `b` values.
    pub fn compile(
        in_lane: Type,
        out_lane: Type,
        vector: bool,
        emit: &dyn Fn(&mut FunctionBuilder, Value, Value) -> Value,
    ) -> Kernel {
        let mut flags = settings::builder();
        flags.set("opt_level", "speed").unwrap();
        let isa = cranelift_native::builder()
            .unwrap()
            .finish(settings::Flags::new(flags))
            .unwrap();
        let mut module = JITModule::new(JITBuilder::with_isa(isa, default_libcall_names()));
        let ptr = module.target_config().pointer_type();
        let mut ctx = module.make_context();
        for _ in 0..3 {
            ctx.func.signature.params.push(AbiParam::new(ptr));
        }
        ctx.func.signature.params.push(AbiParam::new(types::I64));
        let id = module
            .declare_function("k", Linkage::Local, &ctx.func.signature)
            .unwrap();
        let mut fctx = FunctionBuilderContext::new();
        let cfg = module.target_config();
        {
            let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
            let entry = b.create_block();
            let vhead = b.create_block();
            let vbody = b.create_block();
            let shead = b.create_block();
            let sbody = b.create_block();
            let exit = b.create_block();
            for blk in [vhead, vbody, shead, sbody] {
                b.append_block_param(blk, types::I64);
            }
            b.append_block_params_for_function_params(entry);
            b.switch_to_block(entry);
            let p = b.block_params(entry).to_vec();
            let (pa, pb, pd, n) = (p[0], p[1], p[2], p[3]);
            let zero = b.ins().iconst(types::I64, 0);
            let start = if vector { vhead } else { shead };
            b.ins().jump(start, &[BlockArg::Value(zero)]);
            let mf = MemFlagsData::trusted();

            let body = |b: &mut FunctionBuilder, i: Value, lin: Type, lout: Type| {
                let off = b.ins().ishl_imm_u(i, 2);
                let aa = b.ins().iadd(pa, off);
                let ba = b.ins().iadd(pb, off);
                let da = b.ins().iadd(pd, off);
                let x = b.ins().load(lin, mf, aa, 0);
                let y = b.ins().load(lin, mf, ba, 0);
                let r = emit(b, x, y);
                assert_eq!(b.func.dfg.value_type(r), lout);
                b.ins().store(mf, r, da, 0);
            };

            b.switch_to_block(vhead);
            let i = b.block_params(vhead)[0];
            let i4 = b.ins().iadd_imm_u(i, 4);
            let c = b.ins().icmp(
                cranelift_codegen::ir::condcodes::IntCC::SignedLessThanOrEqual,
                i4,
                n,
            );
            b.ins().brif(
                c,
                vbody,
                &[BlockArg::Value(i)],
                shead,
                &[BlockArg::Value(i)],
            );

            b.switch_to_block(vbody);
            let i = b.block_params(vbody)[0];
            body(&mut b, i, vec_of(in_lane), vec_of(out_lane));
            let i4 = b.ins().iadd_imm_u(i, 4);
            b.ins().jump(vhead, &[BlockArg::Value(i4)]);

            b.switch_to_block(shead);
            let i = b.block_params(shead)[0];
            let c = b.ins().icmp(
                cranelift_codegen::ir::condcodes::IntCC::SignedLessThan,
                i,
                n,
            );
            b.ins().brif(c, sbody, &[BlockArg::Value(i)], exit, &[]);

            b.switch_to_block(sbody);
            let i = b.block_params(sbody)[0];
            body(&mut b, i, in_lane, out_lane);
            let i1 = b.ins().iadd_imm_u(i, 1);
            b.ins().jump(shead, &[BlockArg::Value(i1)]);

            b.switch_to_block(exit);
            b.ins().return_(&[]);
            b.seal_all_blocks();
            b.finalize(cfg);
        }
        module.define_function(id, &mut ctx).unwrap();
        module.clear_context(&mut ctx);
        module.finalize_definitions().unwrap();
        let code = module.get_finalized_function(id);
        // SAFETY: `code` is the finalized function `id`, compiled with the signature `KFn` has.
        let f = unsafe { std::mem::transmute::<*const u8, KFn>(code) };
        Kernel { _module: module, f }
    }

    /// Every `step`-th bit pattern of the whole 32-bit space (both signs, inf, NaN).
    pub fn strided_bits(step: u64) -> Vec<u32> {
        (0..(1u64 << 32))
            .step_by(step as usize)
            .map(|v| v as u32)
            .collect()
    }
}

mod accuracy {
    use super::testjit::{compile, strided_bits, Kernel};
    use crate::math::*;
    use cranelift_codegen::ir::types;

    fn kernel(f: MathFn, vector: bool) -> Kernel {
        compile(types::F32, types::F32, vector, &move |b, x, _| {
            emit_math(b, f, x)
        })
    }
    fn pow_kernel(vector: bool) -> Kernel {
        compile(types::F32, types::F32, vector, &|b, x, y| emit_pow(b, x, y))
    }

    fn sigmoid64(x: f64) -> f64 {
        if x < 0.0 {
            let e = x.exp();
            e / (1.0 + e)
        } else {
            1.0 / (1.0 + (-x).exp())
        }
    }

    fn reference(f: MathFn, x: f32) -> f64 {
        let x = x as f64;
        match f {
            MathFn::Exp => x.exp(),
            MathFn::Log => x.ln(),
            MathFn::Tanh => x.tanh(),
            MathFn::Erf => libm::erf(x),
            MathFn::Sin => x.sin(),
            MathFn::Cos => x.cos(),
            MathFn::Sigmoid => sigmoid64(x),
            MathFn::Gelu => 0.5 * x * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2)),
            MathFn::Silu => x * sigmoid64(x),
        }
    }

    /// Error of `y` in ulps of the f32 rounding of `exact` (see the module docs).
    fn ulp_err(y: f32, exact: f64) -> f64 {
        if exact.is_nan() || y.is_nan() {
            return if exact.is_nan() && y.is_nan() {
                0.0
            } else {
                f64::INFINITY
            };
        }
        if y.is_infinite() {
            return if (exact as f32) == y {
                0.0
            } else {
                f64::INFINITY
            };
        }
        let a = exact.abs();
        let e = if a == 0.0 || a.is_infinite() {
            -126
        } else {
            (((a.to_bits() >> 52) & 0x7ff) as i64 - 1023).max(-126)
        };
        if a.is_infinite() {
            return f64::INFINITY;
        }
        let ulp = 2f64.powi(e as i32 - 23);
        (y as f64 - exact).abs() / ulp
    }

    /// Inputs for `f`: a strided sweep of all bit patterns, dense grids over the interesting
    /// range and special values.
    fn inputs(f: MathFn, step: u64) -> Vec<f32> {
        let mut v: Vec<f32> = strided_bits(step).into_iter().map(f32::from_bits).collect();
        let grid = |v: &mut Vec<f32>, lo: f32, hi: f32, n: usize| {
            for i in 0..=n {
                v.push(lo + (hi - lo) * (i as f32 / n as f32));
            }
        };
        match f {
            MathFn::Exp => grid(&mut v, -87.0, 88.0, 1_000_000),
            MathFn::Log => grid(&mut v, 0.5, 2.0, 500_000),
            MathFn::Tanh | MathFn::Erf | MathFn::Sigmoid | MathFn::Gelu | MathFn::Silu => {
                grid(&mut v, -6.0, 6.0, 1_000_000)
            }
            MathFn::Sin | MathFn::Cos => grid(&mut v, -10.0, 10.0, 1_000_000),
        }
        v.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(1),
            f32::from_bits(0x8000_0001),
            f32::from_bits(0x007f_ffff),
            f32::MIN_POSITIVE,
            f32::MAX,
            f32::MIN,
            1.0,
            -1.0,
            88.72,
            88.73,
            -87.3,
            -103.9,
            -104.0,
            0.625,
            -0.625,
            3.92,
            4.0,
            std::f32::consts::FRAC_PI_2,
            std::f32::consts::PI,
            1e4,
            -1e4,
        ]);
        // Pad to a length that is not a multiple of 4 so the scalar tail runs too.
        v.push(0.5);
        if v.len().is_multiple_of(4) {
            v.push(0.25);
        }
        v
    }

    /// Max ulp error of `f` over `xs` restricted to `keep`; also checks vector == scalar.
    fn check(f: MathFn, xs: &[f32], bound: f64, keep: impl Fn(f32) -> bool) {
        let vk = kernel(f, true);
        let sk = kernel(f, false);
        let yv = vk.run_f32(xs, xs);
        let ys = sk.run_f32(xs, xs);
        let mut worst = (0.0f64, 0.0f32, 0.0f32);
        for i in 0..xs.len() {
            assert_eq!(
                yv[i].to_bits(),
                ys[i].to_bits(),
                "{f:?}: vector and scalar differ at x={:e}: {:e} vs {:e}",
                xs[i],
                yv[i],
                ys[i]
            );
            if !keep(xs[i]) {
                continue;
            }
            let err = ulp_err(yv[i], reference(f, xs[i]));
            if err > worst.0 {
                worst = (err, xs[i], yv[i]);
            }
        }
        eprintln!(
            "{f:?}: max {:.3} ulp at x={:e} (got {:e}, want {:e}) over {} points",
            worst.0,
            worst.1,
            worst.2,
            reference(f, worst.1),
            xs.len()
        );
        assert!(worst.0 <= bound, "{f:?}: {} ulp > {bound}", worst.0);
    }

    #[test]
    fn math_exp() {
        check(MathFn::Exp, &inputs(MathFn::Exp, 1031), 1.0, |_| true);
        // The brief's requirement, stated in relative terms.
        let k = kernel(MathFn::Exp, true);
        let xs: Vec<f32> = (0..=1_000_000)
            .map(|i| -87.0 + 175.0 * (i as f32 / 1e6))
            .collect();
        let ys = k.run_f32(&xs, &xs);
        for (x, y) in xs.iter().zip(&ys) {
            let r = (*x as f64).exp();
            assert!(((*y as f64 - r) / r).abs() < 2e-6, "exp({x})");
        }
        let s = k.run_f32(
            &[
                f32::INFINITY,
                f32::NEG_INFINITY,
                0.0,
                -0.0,
                88.73,
                -110.0,
                -1e30,
            ],
            &[0.0; 7],
        );
        assert_eq!(s, [f32::INFINITY, 0.0, 1.0, 1.0, f32::INFINITY, 0.0, 0.0]);
        assert!(k.run_f32(&[f32::NAN], &[0.0])[0].is_nan());
    }

    #[test]
    fn math_log() {
        check(MathFn::Log, &inputs(MathFn::Log, 1031), 1.0, |_| true);
        let k = kernel(MathFn::Log, false);
        let s = k.run_f32(&[0.0, -0.0, f32::INFINITY, 1.0], &[0.0; 4]);
        assert_eq!(
            s,
            [f32::NEG_INFINITY, f32::NEG_INFINITY, f32::INFINITY, 0.0]
        );
        let s = k.run_f32(&[-1.0, f32::NEG_INFINITY, -1e-45, f32::NAN], &[0.0; 4]);
        assert!(s.iter().all(|v| v.is_nan()));
    }

    #[test]
    fn math_tanh() {
        check(MathFn::Tanh, &inputs(MathFn::Tanh, 1031), 1.5, |_| true);
        let k = kernel(MathFn::Tanh, false);
        let s = k.run_f32(
            &[f32::INFINITY, f32::NEG_INFINITY, 20.0, -0.0, 1e-30],
            &[0.0; 5],
        );
        assert_eq!(s, [1.0, -1.0, 1.0, -0.0, 1e-30]);
        assert!(s[3].is_sign_negative());
    }

    #[test]
    fn math_erf() {
        check(MathFn::Erf, &inputs(MathFn::Erf, 1031), 1.5, |_| true);
        let k = kernel(MathFn::Erf, false);
        let s = k.run_f32(
            &[f32::INFINITY, f32::NEG_INFINITY, 5.0, -0.0, 1e-30],
            &[0.0; 5],
        );
        // erf(1e-30) = 1.12837916709...e-30, whose nearest f32 is 1.1283791e-30.
        assert_eq!(s, [1.0, -1.0, 1.0, -0.0, 1.128_379_1e-30]);
        assert!(s[3].is_sign_negative());
        // NaN stays NaN (its table index is garbage, masked into the table).
        let n = k.run_f32(&[f32::NAN, -f32::NAN], &[0.0; 2]);
        assert!(n.iter().all(|v| v.is_nan()));
    }

    #[test]
    fn math_sigmoid() {
        check(MathFn::Sigmoid, &inputs(MathFn::Sigmoid, 1031), 2.5, |_| {
            true
        });
        let k = kernel(MathFn::Sigmoid, false);
        let s = k.run_f32(&[f32::INFINITY, f32::NEG_INFINITY, 0.0, -100.0], &[0.0; 4]);
        assert_eq!(&s[..3], [1.0, 0.0, 0.5]);
        assert!((s[3] as f64 - 3.720076e-44).abs() < 3e-45);
    }

    /// The composites are the expressions `decompose` writes (so their error is that of the
    /// expression, not of a correctly rounded `gelu`): `1 + erf(x/sqrt 2)` cancels for
    /// `x < -1`, so gelu's relative error is bounded above that only.
    #[test]
    fn math_gelu_silu() {
        check(MathFn::Gelu, &inputs(MathFn::Gelu, 1031), 3.0, |x| {
            x >= -1.0
        });
        // Below -80 `x * sigmoid(x)` is subnormal, with its absolute rounding.
        check(MathFn::Silu, &inputs(MathFn::Silu, 1031), 3.5, |x| {
            x >= -80.0
        });
        let k = kernel(MathFn::Gelu, false);
        let g = k.run_f32(&[f32::INFINITY, f32::NEG_INFINITY, 0.0, 1.0], &[0.0; 4]);
        assert_eq!(g[0], f32::INFINITY);
        // `-inf * 0.5 * (1 + erf(-inf))` is `-inf * 0`, as in the decomposed expression.
        assert!(g[1].is_nan());
        assert_eq!(g[2], 0.0);
        assert!((g[3] as f64 - 0.841_344_746).abs() < 1e-7);
    }

    #[test]
    fn math_sin_cos() {
        for f in [MathFn::Sin, MathFn::Cos] {
            let xs = inputs(f, 1031);
            check(f, &xs, 3.5, |x| x.abs() <= 1e5);
            // Anything finite stays within [-1, 1]; infinities give NaN.
            let k = kernel(f, true);
            let ys = k.run_f32(&xs, &xs);
            for (x, y) in xs.iter().zip(&ys) {
                if x.is_finite() {
                    assert!(y.abs() <= 1.0, "{f:?}({x}) = {y}");
                } else {
                    assert!(y.is_nan());
                }
            }
        }
        let k = kernel(MathFn::Sin, false);
        let s = k.run_f32(&[-0.0, 0.0], &[0.0; 2]);
        assert!(s[0] == 0.0 && s[0].is_sign_negative() && s[1].is_sign_positive());
    }

    /// Deterministic xorshift for test inputs.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    fn check_pow(a: &[f32], b: &[f32], bound: f64) -> f64 {
        let yv = pow_kernel(true).run_f32(a, b);
        let ys = pow_kernel(false).run_f32(a, b);
        let mut worst = (0.0, 0.0, 0.0);
        for i in 0..a.len() {
            assert_eq!(yv[i].to_bits(), ys[i].to_bits(), "pow({}, {})", a[i], b[i]);
            let r = (a[i] as f64).powf(b[i] as f64);
            let err = ulp_err(yv[i], r);
            if err > worst.0 {
                worst = (err, a[i], b[i]);
            }
        }
        eprintln!(
            "pow: max {:.3} ulp at ({:e}, {:e})",
            worst.0, worst.1, worst.2
        );
        assert!(
            worst.0 <= bound,
            "pow({}, {}): {} ulp",
            worst.1,
            worst.2,
            worst.0
        );
        worst.0
    }

    #[test]
    fn math_pow_accuracy() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        while a.len() < 2_000_001 {
            // log-uniform base over the whole range, exponent log-uniform in ±[2^-6, 2^6];
            // keep the pairs whose result is finite and nonzero.
            let x = 2f64.powf(rng.unit() * 256.0 - 128.0) as f32;
            let y = (2f64.powf(rng.unit() * 12.0 - 6.0) * if rng.unit() < 0.5 { -1.0 } else { 1.0 })
                as f32;
            let r = (x as f64).powf(y as f64);
            if x > 0.0 && r > 1e-45 && r < 3.4e38 {
                a.push(x);
                b.push(y);
            }
        }
        check_pow(&a, &b, 1.5);
        // Bases near 1 with large exponents: |b * log a| up to ~100 stresses log's precision.
        let (mut a, mut b) = (Vec::new(), Vec::new());
        while a.len() < 500_001 {
            let x = (1.0 + (rng.unit() - 0.5) * 2f64.powf(-(rng.unit() * 20.0))) as f32;
            let y = ((rng.unit() - 0.5) * 200.0 / (x as f64).ln().abs().max(1e-30)) as f32;
            let r = (x as f64).powf(y as f64);
            if x != 1.0 && y.is_finite() && r > 1e-45 && r < 3.4e38 {
                a.push(x);
                b.push(y);
            }
        }
        check_pow(&a, &b, 1.5);
        // Common integer/half exponents over every 1031st positive float, and negative bases.
        for e in [2.0f32, 3.0, 0.5, -1.0, -0.5, 1.0, 7.0, -2.0] {
            let xs: Vec<f32> = strided_bits(1031)
                .into_iter()
                .map(f32::from_bits)
                .filter(|x| x.is_finite() && *x != 0.0)
                .filter(|x| {
                    let r = (*x as f64).powf(e as f64);
                    r.is_nan() || (r.abs() < 3.4e38 && r.abs() > 1e-45)
                })
                .collect();
            let es = vec![e; xs.len()];
            check_pow(&xs, &es, 1.5);
        }
    }

    #[test]
    fn math_pow_special() {
        let inf = f32::INFINITY;
        let nan = f32::NAN;
        #[rustfmt::skip]
        let cases: &[(f32, f32, f32)] = &[
            (nan, 0.0, 1.0), (nan, -0.0, 1.0), (2.0, 0.0, 1.0), (-inf, 0.0, 1.0), (0.0, 0.0, 1.0),
            (1.0, nan, 1.0), (1.0, inf, 1.0), (1.0, -inf, 1.0), (-1.0, inf, 1.0), (-1.0, -inf, 1.0),
            (0.0, 2.0, 0.0), (0.0, 0.5, 0.0), (0.0, -1.0, inf), (0.0, -0.5, inf), (0.0, -inf, inf),
            (0.0, inf, 0.0), (-0.0, 3.0, -0.0), (-0.0, 2.0, 0.0), (-0.0, -3.0, -inf),
            (-0.0, -2.0, inf), (-0.0, 0.5, 0.0), (-0.0, -0.5, inf),
            (-2.0, 2.0, 4.0), (-2.0, 3.0, -8.0), (-2.0, -1.0, -0.5), (-2.0, -2.0, 0.25),
            (-3.0, 1.0, -3.0), (-2.0, inf, inf), (-2.0, -inf, 0.0), (-0.5, inf, 0.0),
            (-0.5, -inf, inf), (2.0, inf, inf), (0.5, inf, 0.0), (2.0, -inf, 0.0), (0.5, -inf, inf),
            (inf, 2.0, inf), (inf, -2.0, 0.0), (inf, 0.5, inf), (-inf, 3.0, -inf), (-inf, 2.0, inf),
            (-inf, -3.0, -0.0), (-inf, -2.0, 0.0), (-inf, 0.5, inf), (-inf, -0.5, 0.0),
            (-2.0, 16777216.0, inf), (-2.0, 16777217.0, inf), (-1.0, 16777215.0, -1.0),
            (-1.0, 8388609.0, -1.0), (-1.0, 8388610.0, 1.0),
            (2.0, 128.0, inf), (2.0, -149.0, 1e-45), (2.0, -150.0, 0.0), (2.0, 1e30, inf),
            (2.0, -1e30, 0.0), (1.0000001, 1e30, inf), (0.9999999, 1e30, 0.0), (4.0, 0.5, 2.0),
            (9.0, 0.5, 3.0), (10.0, 2.0, 100.0), (3.0, 3.0, 27.0), (0.99999994, 1e10, 0.0),
            (0.99999994, -1e10, inf), (1.0000001, 4e9, inf), (-0.99999994, 1e10, 0.0),
        ];
        let a: Vec<f32> = cases.iter().map(|c| c.0).collect();
        let b: Vec<f32> = cases.iter().map(|c| c.1).collect();
        for vector in [true, false] {
            let got = pow_kernel(vector).run_f32(&a, &b);
            for (c, g) in cases.iter().zip(&got) {
                assert!(
                    g.to_bits() == c.2.to_bits(),
                    "pow({}, {}) = {g:e}, want {:e} (vector {vector})",
                    c.0,
                    c.1,
                    c.2
                );
            }
        }
        #[rustfmt::skip]
        let nans: &[(f32, f32)] = &[
            (-2.0, 0.5), (-2.0, -1.5), (-0.5, 0.3), (-f32::MAX, 0.5), (nan, 1.0), (2.0, nan),
            (nan, nan), (0.0, nan), (inf, nan), (nan, inf), (-1.0, nan), (-1.0, 0.5),
        ];
        let a: Vec<f32> = nans.iter().map(|c| c.0).collect();
        let b: Vec<f32> = nans.iter().map(|c| c.1).collect();
        for vector in [true, false] {
            let got = pow_kernel(vector).run_f32(&a, &b);
            for (c, g) in nans.iter().zip(&got) {
                assert!(g.is_nan(), "pow({}, {}) = {g}, want NaN", c.0, c.1);
            }
        }
    }

    /// Every f32 input for every function (minutes; run with `--ignored --nocapture`).
    #[test]
    #[ignore]
    fn exhaustive_bounds() {
        let chunk = 1usize << 24;
        // MATH_FNS=sin,cos restricts the run.
        let only = std::env::var("MATH_FNS").unwrap_or_default().to_lowercase();
        for f in MathFn::ALL {
            if !only.is_empty()
                && !only
                    .split(',')
                    .any(|n| n == format!("{f:?}").to_lowercase())
            {
                continue;
            }
            let buckets: &[f32] = match f {
                MathFn::Sin | MathFn::Cos => &[1e2, 1e3, 1e4, 1e5],
                _ => &[f32::INFINITY],
            };
            let vkk = kernel(f, true);
            let skk = kernel(f, false);
            let (vk, sk) = (vkk.raw(), skk.raw());
            let run = |k: super::testjit::KFn, a: &[u32], o: &mut [u32]| {
                assert_eq!(a.len(), o.len());
                // SAFETY: the kernel reads `a.len()` values of `a` and writes as many of `o` (of
                // the same length); `vkk` and `skk`, which own the code, outlive the calls.
                unsafe { k(a.as_ptr(), a.as_ptr(), o.as_mut_ptr(), a.len() as i64) }
            };
            let worst = std::sync::Mutex::new(vec![(0.0f64, 0.0f32); buckets.len()]);
            let next = std::sync::atomic::AtomicU64::new(0);
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        let mut out = vec![0u32; chunk];
                        let mut outs = vec![0u32; chunk];
                        let mut local = vec![(0.0f64, 0.0f32); buckets.len()];
                        loop {
                            let c = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if c >= (1u64 << 32) / chunk as u64 {
                                break;
                            }
                            let xs: Vec<u32> = (0..chunk)
                                .map(|i| (c as usize * chunk + i) as u32)
                                .collect();
                            run(vk, &xs, &mut out);
                            // The scalar path on a slice of each chunk (it is slower).
                            let m = chunk / 16;
                            run(sk, &xs[..m], &mut outs[..m]);
                            for i in 0..m {
                                assert_eq!(out[i], outs[i], "{f:?} scalar/vector at {:#x}", xs[i]);
                            }
                            for i in 0..chunk {
                                let x = f32::from_bits(xs[i]);
                                let err = ulp_err(f32::from_bits(out[i]), reference(f, x));
                                for (k, lim) in buckets.iter().enumerate() {
                                    if (x.abs() <= *lim || x.is_nan()) && err > local[k].0 {
                                        local[k] = (err, x);
                                    }
                                }
                            }
                        }
                        let mut w = worst.lock().unwrap();
                        for k in 0..buckets.len() {
                            if local[k].0 > w[k].0 {
                                w[k] = local[k];
                            }
                        }
                    });
                }
            });
            for (k, lim) in buckets.iter().enumerate() {
                let (e, x) = worst.lock().unwrap()[k];
                println!("{f:?} |x| <= {lim:e}: max {e:.3} ulp at x = {x:e}");
            }
        }
    }
}

/// The block routines (16 lanes, ahead of time) against the inline form (4 lanes and scalar,
/// Cranelift): the same algorithm, so the same bits, for every 1031st f32 bit pattern and
/// block lengths with tails.
mod blocks {
    use super::testjit::{compile, strided_bits};
    use crate::math::block::{apply_block, apply_block_to, block_isa, BlockIsa};
    use crate::math::*;
    use cranelift_codegen::ir::types;

    fn isas() -> Vec<BlockIsa> {
        match block_isa() {
            Some(BlockIsa::Avx512) => vec![BlockIsa::Avx512, BlockIsa::Avx2],
            Some(BlockIsa::Avx2) => vec![BlockIsa::Avx2],
            None => vec![],
        }
    }

    #[test]
    fn block_routines_match_inline_bit_for_bit() {
        if block_isa().is_none() {
            eprintln!("no block routines on this CPU: nothing to compare");
            return;
        }
        let xs: Vec<f32> = strided_bits(1031).into_iter().map(f32::from_bits).collect();
        for f in MathFn::ALL {
            let inline = compile(types::F32, types::F32, true, &move |b, x, _| {
                emit_math(b, f, x)
            })
            .run_f32(&xs, &xs);
            for isa in isas() {
                // Odd block lengths, so that every routine's padded tail is exercised; in place
                // (the kernels' block buffers) and out of place (straight into an output).
                for (block, in_place) in [(7usize, true), (4099, true), (13, false), (4099, false)]
                {
                    let mut ys = xs.clone();
                    if in_place {
                        ys.chunks_mut(block).for_each(|c| apply_block(f, isa, c));
                    } else {
                        ys.fill(f32::NAN);
                        for (src, dst) in xs.chunks(block).zip(ys.chunks_mut(block)) {
                            apply_block_to(f, isa, src, dst);
                        }
                    }
                    for (i, (&y, &want)) in ys.iter().zip(&inline).enumerate() {
                        assert!(
                            y.to_bits() == want.to_bits(),
                            "{f:?} {isa:?} block {block} (in place: {in_place}): x = {:e} ({:#x}) \
                             gives {y:e}, inline {want:e}",
                            xs[i],
                            xs[i].to_bits()
                        );
                    }
                }
            }
        }
    }
}
