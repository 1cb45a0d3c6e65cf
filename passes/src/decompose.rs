//! `decompose`: rewrites every composite op into prims (AOTAutograd's decomposition step).
//!
//! Assumes a verified graph. Guarantees a graph of prims only (`Op::is_prim`) and `Grad` nodes
//! (which `autodiff` expands next, over these prims), with the same inputs and output types, in which every `Matmul` has operands of rank >= 2 and dtype f32.
//! Composites over f16/bf16 are computed in f32 and cast back once, as PyTorch's decompositions
//! do, so reduced precision rounds at the op's result and not at every intermediate.

use minductor_ir::{
    BinaryOp, DType, Dim, Graph, NodeId, Op, ReduceOp, Shape, SliceFrom, UnaryOp, Window2d,
};

pub fn decompose(graph: &Graph) -> Graph {
    let mut b = Builder { g: Graph::new() };
    let mut map: Vec<NodeId> = Vec::with_capacity(graph.len());
    let implicit = implicit_im2cols(graph);
    for (n, node) in graph.nodes().iter().enumerate() {
        let ins: Vec<NodeId> = node.inputs.iter().map(|i| map[i.index()]).collect();
        let id = match &node.op {
            Op::Input { name } => b.g.input(name.clone(), node.ty.clone()),
            Op::Constant { value } => b.g.constant(*value, node.ty.dtype),
            Op::Matmul => b.matmul(ins[0], ins[1]),
            Op::Im2col { window } if !implicit[n] => b.im2col(ins[0], window),
            // Gradients are expanded by `autodiff`, over the prims this pass produces.
            op @ Op::Grad { .. } => b.add(op.clone(), &ins),
            op if op.is_prim() => b.add(op.clone(), &ins),
            op => {
                let dtype = node.ty.dtype;
                if matches!(dtype, DType::F16 | DType::BF16) {
                    let wide: Vec<NodeId> = ins.iter().map(|&i| b.cast(i, DType::F32)).collect();
                    let r = b.composite(op, &wide);
                    b.cast(r, dtype)
                } else {
                    b.composite(op, &ins)
                }
            }
        };
        map.push(id);
    }
    b.g.set_outputs(graph.outputs().iter().map(|o| map[o.index()]).collect());
    b.g
}

/// Which nodes are `im2col`s that stay prims: f32, in a graph without gradients, read only as
/// the right operand of GEMMs through a reshape `[N, C·KH·KW, L] → [N, groups, C·KH·KW / groups,
/// L]` (how `conv2d` traces), so that `fuse` can pack those GEMMs' panels from the input itself.
fn implicit_im2cols(graph: &Graph) -> Vec<bool> {
    let mut users: Vec<Vec<NodeId>> = vec![Vec::new(); graph.len()];
    for id in graph.ids() {
        for &i in &graph.node(id).inputs {
            users[i.index()].push(id);
        }
    }
    let has_grad = graph
        .nodes()
        .iter()
        .any(|n| matches!(n.op, Op::Grad { .. }));
    let outputs = graph.outputs();
    let only_right_operand = |id: NodeId| {
        !outputs.contains(&id)
            && users[id.index()].iter().all(|&u| {
                let n = graph.node(u);
                matches!(n.op, Op::Matmul) && n.inputs[1] == id && n.inputs[0] != id
            })
    };
    graph
        .ids()
        .map(|id| {
            let node = graph.node(id);
            let Op::Im2col { window } = &node.op else {
                return false;
            };
            let taps = window.taps();
            !has_grad
                && node.ty.dtype == DType::F32
                && !outputs.contains(&id)
                && users[id.index()].iter().all(|&u| {
                    let shape = &graph.ty(u).shape;
                    let columns = node.ty.shape[1].as_static().unwrap_or(0);
                    let splits = matches!(graph.node(u).op, Op::Reshape { .. })
                        && shape.len() == 4
                        && shape[0] == node.ty.shape[0]
                        && shape[3] == node.ty.shape[2]
                        && match (shape[1].as_static(), shape[2].as_static()) {
                            (Some(groups), Some(rows)) => {
                                groups * rows == columns && rows % taps.max(1) == 0
                            }
                            _ => false,
                        };
                    splits && only_right_operand(u)
                })
        })
        .collect()
}

struct Builder {
    g: Graph,
}

impl Builder {
    fn add(&mut self, op: Op, inputs: &[NodeId]) -> NodeId {
        let what = op.to_string();
        self.g
            .add(op, inputs)
            .unwrap_or_else(|e| panic!("decomposition produced an ill-typed {what}: {e}"))
    }
    fn dtype(&self, x: NodeId) -> DType {
        self.g.ty(x).dtype
    }
    fn shape(&self, x: NodeId) -> Shape {
        self.g.ty(x).shape.clone()
    }
    fn scalar(&mut self, value: f64, like: NodeId) -> NodeId {
        let dtype = self.dtype(like);
        self.g.constant(value, dtype)
    }
    fn cast(&mut self, x: NodeId, dtype: DType) -> NodeId {
        if self.dtype(x) == dtype {
            return x;
        }
        self.add(Op::Cast { dtype }, &[x])
    }
    fn bin(&mut self, op: BinaryOp, a: NodeId, c: NodeId) -> NodeId {
        self.add(Op::Binary(op), &[a, c])
    }
    fn bin_scalar(&mut self, op: BinaryOp, a: NodeId, value: f64) -> NodeId {
        let c = self.scalar(value, a);
        self.bin(op, a, c)
    }
    fn un(&mut self, op: UnaryOp, a: NodeId) -> NodeId {
        self.add(Op::Unary(op), &[a])
    }
    fn reduce(&mut self, op: ReduceOp, x: NodeId, axes: &[usize], keepdim: bool) -> NodeId {
        self.add(
            Op::Reduce {
                op,
                axes: axes.to_vec(),
                keepdim,
            },
            &[x],
        )
    }
    fn reshape(&mut self, x: NodeId, shape: Shape) -> NodeId {
        self.add(Op::Reshape { shape }, &[x])
    }

    /// `im2col` in prims: the input padded with zeros (a `cat` with zeros along W, then H),
    /// each kernel offset's strided window of it, and a `cat` of those windows side by side.
    fn im2col(&mut self, x: NodeId, window: &Window2d) -> NodeId {
        let mut padded = x;
        for d in [3, 2] {
            let amount = window.padding[d - 2];
            if amount == 0 {
                continue;
            }
            let mut side = self.shape(padded);
            side[d] = Dim::Static(amount);
            let zero = self.scalar(0.0, x);
            let zeros = self.add(Op::Expand { shape: side }, &[zero]);
            padded = self.add(Op::Cat { dim: d }, &[zeros, padded, zeros]);
        }
        let shape = self.shape(x);
        let (h, w) = (
            shape[2].as_static().unwrap_or(0),
            shape[3].as_static().unwrap_or(0),
        );
        let [oh, ow] = window
            .output_size(h, w)
            .expect("im2col's type rule checked that the window fits");
        let mut windows = Vec::with_capacity(window.taps());
        for i in 0..window.kernel[0] {
            for j in 0..window.kernel[1] {
                let mut tap = padded;
                for (d, offset, out) in [(2, i, oh), (3, j, ow)] {
                    let start = offset * window.dilation[d - 2];
                    let step = window.stride[d - 2];
                    tap = self.add(
                        Op::Slice {
                            dim: d,
                            start,
                            end: start + (out - 1) * step + 1,
                            step,
                            from: SliceFrom::Start,
                        },
                        &[tap],
                    );
                }
                let mut unsqueezed = self.shape(tap);
                unsqueezed.insert(2, Dim::Static(1));
                windows.push(self.reshape(tap, unsqueezed));
            }
        }
        let stacked = if windows.len() == 1 {
            windows[0]
        } else {
            self.add(Op::Cat { dim: 2 }, &windows)
        };
        let c = shape[1].as_static().unwrap_or(0);
        let flat = Shape::from_slice(&[
            shape[0],
            Dim::Static(c * window.taps()),
            Dim::Static(oh * ow),
        ]);
        self.reshape(stacked, flat)
    }

    /// Number of elements over `axes` of `x`, less `minus`, as a value like `x` that broadcasts
    /// against a reduction over `axes`: a constant when those dims are static, else a sum of
    /// ones over them (it fuses into the same row loop as the reduction it divides).
    fn count(&mut self, x: NodeId, axes: &[usize], keepdim: bool, minus: f64) -> NodeId {
        let shape = self.shape(x);
        let sizes: Option<Vec<usize>> = axes.iter().map(|&a| shape[a].as_static()).collect();
        if let Some(sizes) = sizes {
            return self.scalar(sizes.iter().product::<usize>() as f64 - minus, x);
        }
        let one = self.scalar(1.0, x);
        let ones = self.add(Op::Expand { shape }, &[one]);
        let n = self.reduce(ReduceOp::Sum, ones, axes, keepdim);
        if minus == 0.0 {
            n
        } else {
            self.bin_scalar(BinaryOp::Sub, n, minus)
        }
    }

    fn mean(&mut self, x: NodeId, axes: &[usize], keepdim: bool) -> NodeId {
        let n = self.count(x, axes, keepdim, 0.0);
        let s = self.reduce(ReduceOp::Sum, x, axes, keepdim);
        self.bin(BinaryOp::Div, s, n)
    }

    /// torch.matmul on prims: 1-d operands become matrices, f16/bf16 multiply in f32.
    fn matmul(&mut self, a: NodeId, c: NodeId) -> NodeId {
        let dtype = self.dtype(a);
        let (a_rank, c_rank) = (self.shape(a).len(), self.shape(c).len());
        let a2 = if a_rank == 1 {
            let mut s = self.shape(a);
            s.insert(0, Dim::Static(1));
            self.reshape(a, s)
        } else {
            a
        };
        let c2 = if c_rank == 1 {
            let mut s = self.shape(c);
            s.push(Dim::Static(1));
            self.reshape(c, s)
        } else {
            c
        };
        let (a32, c32) = (self.cast(a2, DType::F32), self.cast(c2, DType::F32));
        let mut out = self.add(Op::Matmul, &[a32, c32]);
        if a_rank == 1 || c_rank == 1 {
            let mut s = self.shape(out);
            let r = s.len();
            if c_rank == 1 {
                s.remove(r - 1);
            }
            if a_rank == 1 {
                s.remove(s.len() - 1 - (c_rank != 1) as usize);
            }
            out = self.reshape(out, s);
        }
        self.cast(out, dtype)
    }

    fn composite(&mut self, op: &Op, ins: &[NodeId]) -> NodeId {
        let x = ins[0];
        match op {
            // Over an empty dim the result is empty too (and a max over it is ill-typed).
            Op::Softmax { dim } | Op::LogSoftmax { dim }
                if self.shape(x)[*dim] == Dim::Static(0) =>
            {
                x
            }
            Op::Relu => self.bin_scalar(BinaryOp::Maximum, x, 0.0),
            Op::Silu => {
                let s = self.un(UnaryOp::Sigmoid, x);
                self.bin(BinaryOp::Mul, x, s)
            }
            Op::Gelu { tanh: false } => {
                // 0.5 * x * (1 + erf(x / sqrt(2)))
                let scaled = self.bin_scalar(BinaryOp::Mul, x, std::f64::consts::FRAC_1_SQRT_2);
                let e = self.un(UnaryOp::Erf, scaled);
                let one_plus = self.bin_scalar(BinaryOp::Add, e, 1.0);
                let half_x = self.bin_scalar(BinaryOp::Mul, x, 0.5);
                self.bin(BinaryOp::Mul, half_x, one_plus)
            }
            Op::Gelu { tanh: true } => {
                // 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
                let x2 = self.bin(BinaryOp::Mul, x, x);
                let x3 = self.bin(BinaryOp::Mul, x2, x);
                let c = self.bin_scalar(BinaryOp::Mul, x3, 0.044715);
                let inner = self.bin(BinaryOp::Add, x, c);
                let scaled =
                    self.bin_scalar(BinaryOp::Mul, inner, (2.0 / std::f64::consts::PI).sqrt());
                let t = self.un(UnaryOp::Tanh, scaled);
                let one_plus = self.bin_scalar(BinaryOp::Add, t, 1.0);
                let half_x = self.bin_scalar(BinaryOp::Mul, x, 0.5);
                self.bin(BinaryOp::Mul, half_x, one_plus)
            }
            Op::Reciprocal => {
                let one = self.scalar(1.0, x);
                self.bin(BinaryOp::Div, one, x)
            }
            Op::Clamp { min, max } => {
                let lo = match min {
                    Some(v) => self.bin_scalar(BinaryOp::Maximum, x, *v),
                    None => x,
                };
                match max {
                    Some(v) => self.bin_scalar(BinaryOp::Minimum, lo, *v),
                    None => lo,
                }
            }
            // The row max only keeps exp in range: it cancels out, so it is detached and the
            // backward does not differentiate through it (PyTorch's softmax backward does not).
            Op::Softmax { dim } => {
                let m = self.reduce(ReduceOp::Max, x, &[*dim], true);
                let m = self.add(Op::Detach, &[m]);
                let shifted = self.bin(BinaryOp::Sub, x, m);
                let e = self.un(UnaryOp::Exp, shifted);
                let s = self.reduce(ReduceOp::Sum, e, &[*dim], true);
                self.bin(BinaryOp::Div, e, s)
            }
            Op::LogSoftmax { dim } => {
                let m = self.reduce(ReduceOp::Max, x, &[*dim], true);
                let m = self.add(Op::Detach, &[m]);
                let shifted = self.bin(BinaryOp::Sub, x, m);
                let e = self.un(UnaryOp::Exp, shifted);
                let s = self.reduce(ReduceOp::Sum, e, &[*dim], true);
                let l = self.un(UnaryOp::Log, s);
                self.bin(BinaryOp::Sub, shifted, l)
            }
            Op::LayerNorm {
                normalized_rank,
                eps,
                has_weight,
                has_bias,
            } => {
                let rank = self.shape(x).len();
                let axes: Vec<usize> = (rank - normalized_rank..rank).collect();
                let mean = self.mean(x, &axes, true);
                let centered = self.bin(BinaryOp::Sub, x, mean);
                let sq = self.bin(BinaryOp::Mul, centered, centered);
                let var = self.mean(sq, &axes, true);
                let var_eps = self.bin_scalar(BinaryOp::Add, var, *eps);
                let inv = self.un(UnaryOp::Rsqrt, var_eps);
                let mut y = self.bin(BinaryOp::Mul, centered, inv);
                if *has_weight {
                    y = self.bin(BinaryOp::Mul, y, ins[1]);
                }
                if *has_bias {
                    y = self.bin(BinaryOp::Add, y, ins[1 + *has_weight as usize]);
                }
                y
            }
            Op::Linear { has_bias } => {
                let wt = self.add(Op::Permute { perm: vec![1, 0] }, &[ins[1]]);
                let y = self.matmul(x, wt);
                if *has_bias {
                    self.bin(BinaryOp::Add, y, ins[2])
                } else {
                    y
                }
            }
            Op::Mean { axes, keepdim } => self.mean(x, axes, *keepdim),
            Op::Var {
                axes,
                correction,
                keepdim,
            } => {
                let mean = self.mean(x, axes, true);
                let centered = self.bin(BinaryOp::Sub, x, mean);
                let sq = self.bin(BinaryOp::Mul, centered, centered);
                let n = self.count(x, axes, *keepdim, *correction as f64);
                let s = self.reduce(ReduceOp::Sum, sq, axes, *keepdim);
                self.bin(BinaryOp::Div, s, n)
            }
            prim => unreachable!("{prim} is a prim, not a composite"),
        }
    }
}
