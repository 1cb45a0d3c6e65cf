//! The cost model (`minductor_kernel_ir::cost`) on programs `fuse` makes from small graphs.

use minductor_ir::{
    static_shape, BinaryOp, DType, Graph, NodeId, Op, SliceFrom, TensorType, UnaryOp,
};
use minductor_kernel_ir::cost::*;
use minductor_kernel_ir::*;
use minductor_passes::{decompose, fuse, simplify};

fn input(g: &mut Graph, name: &str, shape: &[usize]) -> NodeId {
    g.input(name, TensorType::new(DType::F32, static_shape(shape)))
}

fn costs(g: &Graph) -> (Program, Vec<StepCost>) {
    let program = fuse(&simplify(&decompose(g))).expect("static graphs fuse");
    let costs = program_cost(&program);
    (program, costs)
}

fn binary(g: &mut Graph, op: BinaryOp, a: NodeId, b: NodeId) -> NodeId {
    g.add(Op::Binary(op), &[a, b]).unwrap()
}

#[test]
fn softmax_reads_its_input_once_and_counts_each_stage() {
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[4, 8]);
    let s = g.add(Op::Softmax { dim: 1 }, &[x]).unwrap();
    g.set_outputs(vec![s]);
    let (program, c) = costs(&g);
    assert_eq!(c.len(), 1, "{program}");
    assert_eq!(c[0].kind, StepKind::Kernel);
    assert_eq!(c[0].name, program.kernels().next().unwrap().name);
    // x is loaded by all three stages but is one 32-element buffer.
    assert_eq!(
        (c[0].bytes_read, c[0].bytes_written),
        (128, 128),
        "{program}"
    );
    // max: 32 combines; sum: sub, exp and 32 combines; store: sub, exp, div.
    assert_eq!(c[0].flops, 32 + (2 * 32 + 32) + 3 * 32, "{program}");
    assert_eq!(c[0].domain_text(), "[4] x [8] [8] [8]");
    assert_eq!(c[0].nodes.len(), 5, "max, sub, exp, sum, div");
}

#[test]
fn broadcast_operands_count_their_own_size() {
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[8, 16]);
    let w = input(&mut g, "w", &[16]);
    let b = input(&mut g, "b", &[16]);
    let xw = binary(&mut g, BinaryOp::Mul, x, w);
    let y = binary(&mut g, BinaryOp::Add, xw, b);
    let e = g.add(Op::Unary(UnaryOp::Exp), &[y]).unwrap();
    g.set_outputs(vec![e]);
    let (program, c) = costs(&g);
    assert_eq!(c.len(), 1, "{program}");
    assert_eq!(c[0].bytes_read, (128 + 16 + 16) * 4, "{program}");
    assert_eq!(c[0].bytes_written, 128 * 4);
    assert_eq!(c[0].flops, 3 * 128, "mul, add, exp per element");
}

#[test]
fn overlapping_slices_count_the_union() {
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[10]);
    let slice = |g: &mut Graph, start| {
        g.add(
            Op::Slice {
                dim: 0,
                start,
                end: start + 6,
                step: 1,
                from: SliceFrom::Start,
            },
            &[x],
        )
        .unwrap()
    };
    let a = slice(&mut g, 0);
    let b = slice(&mut g, 1);
    let y = binary(&mut g, BinaryOp::Add, a, b);
    g.set_outputs(vec![y]);
    let (program, c) = costs(&g);
    assert_eq!(c.len(), 1, "{program}");
    // x[0..6] and x[1..7]: 7 distinct elements, not 12 and not the whole buffer's 10.
    assert_eq!(c[0].bytes_read, 7 * 4, "{program}");
    assert_eq!(c[0].bytes_written, 6 * 4);
    assert_eq!(c[0].flops, 6);
}

#[test]
fn ops_invariant_in_the_inner_loop_count_once_per_row() {
    // x / (x.sum(-1) + 1): the add runs once per row, the division once per element.
    let mut g = Graph::new();
    let x = input(&mut g, "x", &[4, 8]);
    let s = g
        .add(
            Op::Reduce {
                op: minductor_ir::ReduceOp::Sum,
                axes: vec![1],
                keepdim: true,
            },
            &[x],
        )
        .unwrap();
    let one = g.constant(1.0, DType::F32);
    let d = binary(&mut g, BinaryOp::Add, s, one);
    let y = binary(&mut g, BinaryOp::Div, x, d);
    g.set_outputs(vec![y]);
    let (program, c) = costs(&g);
    assert_eq!(c.len(), 1, "{program}");
    assert_eq!(c[0].flops, 32 + 4 + 32, "{program}");
    assert_eq!((c[0].bytes_read, c[0].bytes_written), (128, 128));
}

#[test]
fn matmul_counts_two_flops_per_multiply_add_and_each_operand_once() {
    let mut g = Graph::new();
    let a = input(&mut g, "a", &[5, 7]);
    let b = input(&mut g, "b", &[9, 7]);
    let bt = g.add(Op::Permute { perm: vec![1, 0] }, &[b]).unwrap();
    let m = g.add(Op::Matmul, &[a, bt]).unwrap();
    g.set_outputs(vec![m]);
    let (program, c) = costs(&g);
    assert_eq!(c.len(), 1, "{program}");
    assert_eq!(c[0].kind, StepKind::Matmul);
    assert_eq!(c[0].name, "k0_matmul");
    assert_eq!(c[0].flops, 2 * 5 * 9 * 7);
    assert_eq!(c[0].bytes_read, (5 * 7 + 9 * 7) * 4, "{program}");
    assert_eq!(c[0].bytes_written, 5 * 9 * 4);
    assert_eq!(c[0].domain_text(), "[5, 9] x [7]");
    assert_eq!(c[0].nodes, vec![m]);
}

#[test]
fn table_lists_every_step_and_the_totals() {
    let mut g = Graph::new();
    let a = input(&mut g, "a", &[5, 7]);
    let b = input(&mut g, "b", &[7, 9]);
    let m = g.add(Op::Matmul, &[a, b]).unwrap();
    let r = g.add(Op::Unary(UnaryOp::Tanh), &[m]).unwrap();
    g.set_outputs(vec![r]);
    let (program, c) = costs(&g);
    assert_eq!(c.len(), 2, "{program}");
    let text = CostTable(&c).to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("kernel"), "{text}");
    assert!(lines[1].starts_with("k0_matmul"), "{text}");
    assert!(lines[2].starts_with("k1_tanh"), "{text}");
    let total = 2 * 5 * 9 * 7 + 45;
    assert!(
        lines[3].starts_with("total") && lines[3].ends_with(&format!(" {total}")),
        "{text}"
    );
}
