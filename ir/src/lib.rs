//! minductor's tensor IR: dtypes, shapes with symbolic dims, the op set and the SSA graph.
//!
//! Everything here prints as text (`Display`) and parses back (`Graph: FromStr`, `text`), and `Graph::verify` checks the invariants passes
//! rely on. No other minductor crate is a dependency of this one.

mod dtype;
mod error;
mod graph;
mod op;
mod parse;
mod shape;
mod size_expr;
pub mod text;

pub use dtype::DType;
pub use error::IrError;
pub use graph::{Graph, Node, NodeId};
pub use op::{infer_type, BinaryOp, CompareOp, Op, ReduceOp, SliceFrom, UnaryOp, Window2d};
pub use parse::{parse_op, parse_tensor_type, window2d};
pub use shape::{
    broadcast_shapes, check_size, checked_bytes, distinct_places, shape_string, static_shape, Dim,
    LayoutFault, Shape, SymId, TensorType, MAX_TENSOR_BYTES,
};
pub use size_expr::{Monomial, SizeExpr};
pub use text::ParseError;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_places_finds_what_a_strided_layout_spans_and_where_positions_meet() {
        // `[b, h, t, d]` written as `[b, t, h, d]`: every position its own place.
        assert_eq!(distinct_places(&[2, 3, 5, 4], &[60, 4, 12, 1]), Ok(120));
        // Dims of one position and empty shapes constrain nothing.
        assert_eq!(distinct_places(&[1, 4], &[-7, 1]), Ok(4));
        assert_eq!(distinct_places(&[3, 0], &[0, 2]), Ok(0));
        assert_eq!(distinct_places(&[], &[]), Ok(1));
        assert_eq!(
            distinct_places(&[3, 4], &[4, 2]),
            Err(LayoutFault::ColumnsApart(2))
        );
        assert_eq!(
            distinct_places(&[3, 4], &[-4, 1]),
            Err(LayoutFault::Negative(-4))
        );
        // Rows 3 apart for rows of 4, and a broadcast dim: two positions one element.
        assert_eq!(
            distinct_places(&[3, 4], &[3, 1]),
            Err(LayoutFault::SharedPlace)
        );
        assert_eq!(
            distinct_places(&[2, 4], &[0, 1]),
            Err(LayoutFault::SharedPlace)
        );
        assert_eq!(
            distinct_places(&[usize::MAX, 4, 4], &[i128::MAX / 4, 16, 1]),
            Err(LayoutFault::Overflow)
        );
    }

    #[test]
    fn graph_prints_and_verifies() {
        let mut g = Graph::new();
        let x = g.input("x", TensorType::new(DType::F32, static_shape(&[4, 7])));
        let two = g.constant(2.0, DType::F32);
        let y = g.add(Op::Binary(BinaryOp::Mul), &[x, two]).unwrap();
        let s = g
            .add(
                Op::Reduce {
                    op: ReduceOp::Sum,
                    axes: vec![1],
                    keepdim: false,
                },
                &[y],
            )
            .unwrap();
        g.set_outputs(vec![s]);
        g.verify().unwrap();
        let text = g.to_string();
        assert_eq!(
            text,
            "graph(x: f32[4, 7]) {\n  %0 = input[x] : f32[4, 7]\n  %1 = constant[2.0] : f32[]\n  \
             %2 = mul %0, %1 : f32[4, 7]\n  %3 = reduce_sum[axes=[1], keepdim=false] %2 : f32[4]\n  return %3\n}"
        );
    }

    #[test]
    fn type_errors_name_shapes() {
        let mut g = Graph::new();
        let a = g.input("a", TensorType::new(DType::F32, static_shape(&[3, 4])));
        let b = g.input("b", TensorType::new(DType::F32, static_shape(&[5, 6])));
        let err = g.add(Op::Matmul, &[a, b]).unwrap_err().to_string();
        assert!(err.contains("[3, 4] @ [5, 6]"), "{err}");
        let c = g.input("c", TensorType::new(DType::F32, static_shape(&[3])));
        let d = g.input("d", TensorType::new(DType::F32, static_shape(&[4])));
        let err = g
            .add(Op::Binary(BinaryOp::Add), &[c, d])
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot broadcast shapes [3] and [4]"), "{err}");
    }
}
