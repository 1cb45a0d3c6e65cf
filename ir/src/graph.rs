//! The SSA tensor graph: an arena of nodes addressed by typed `u32` ids.
//!
//! Nodes are appended in a topological order (an operand always has a smaller id than its user),
//! which every pass relies on and [`Graph::verify`] checks.

use crate::{infer_type, DType, IrError, Op, TensorType};
use smallvec::SmallVec;
use std::fmt;

/// Index of a node in its [`Graph`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub op: Op,
    pub inputs: SmallVec<[NodeId; 4]>,
    pub ty: TensorType,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    nodes: Vec<Node>,
    inputs: Vec<NodeId>,
    outputs: Vec<NodeId>,
}

impl Graph {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    pub fn ty(&self, id: NodeId) -> &TensorType {
        &self.nodes[id.index()].ty
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Ids of all nodes, in topological order.
    pub fn ids(&self) -> impl Iterator<Item = NodeId> {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    pub fn inputs(&self) -> &[NodeId] {
        &self.inputs
    }

    pub fn outputs(&self) -> &[NodeId] {
        &self.outputs
    }

    /// Name of the graph input `index`.
    pub fn input_name(&self, index: usize) -> &str {
        match &self.node(self.inputs[index]).op {
            Op::Input { name } => name,
            _ => unreachable!("graph inputs are Input nodes"),
        }
    }

    /// Declares a new graph input.
    pub fn input(&mut self, name: impl Into<String>, ty: TensorType) -> NodeId {
        let id = self.push(Node {
            op: Op::Input { name: name.into() },
            inputs: SmallVec::new(),
            ty,
        });
        self.inputs.push(id);
        id
    }

    /// Adds a 0-d constant.
    pub fn constant(&mut self, value: f64, dtype: DType) -> NodeId {
        self.push(Node {
            op: Op::Constant { value },
            inputs: SmallVec::new(),
            ty: TensorType::scalar(dtype),
        })
    }

    /// Appends `op` applied to `inputs`, inferring its type; fails if the op is ill-typed.
    pub fn add(&mut self, op: Op, inputs: &[NodeId]) -> Result<NodeId, IrError> {
        if let Some(bad) = inputs.iter().find(|i| i.index() >= self.nodes.len()) {
            return Err(IrError::ty(
                op.name(),
                format!("operand {bad} does not exist"),
            ));
        }
        let ty = {
            let types: SmallVec<[&TensorType; 4]> = inputs.iter().map(|&i| self.ty(i)).collect();
            infer_type(&op, &types)?
        };
        Ok(self.push(Node {
            op,
            inputs: inputs.into(),
            ty,
        }))
    }

    /// Appends a node whose type the caller vouches for (used by passes that rebuild graphs).
    pub fn push(&mut self, node: Node) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        self.nodes.push(node);
        id
    }

    pub fn set_outputs(&mut self, outputs: Vec<NodeId>) {
        self.outputs = outputs;
    }

    /// For each node, how many times it is used as an operand or output.
    pub fn use_counts(&self) -> Vec<usize> {
        let mut counts = vec![0; self.nodes.len()];
        for node in &self.nodes {
            for &i in &node.inputs {
                counts[i.index()] += 1;
            }
        }
        for &o in &self.outputs {
            counts[o.index()] += 1;
        }
        counts
    }

    /// Checks the invariants: operands precede users, types agree with the op's rule,
    /// inputs are Input nodes, outputs exist.
    pub fn verify(&self) -> Result<(), IrError> {
        for (index, node) in self.nodes.iter().enumerate() {
            let err = |message: String| IrError::Verify {
                node: index as u32,
                message,
            };
            if node.inputs.iter().any(|i| i.index() >= index) {
                return Err(err("operand does not precede its user".into()));
            }
            crate::shape::check_size(&node.op.name(), &node.ty).map_err(|e| err(e.to_string()))?;
            match &node.op {
                Op::Input { .. } => {
                    if !self.inputs.contains(&NodeId(index as u32)) {
                        return Err(err("input node not listed among graph inputs".into()));
                    }
                }
                Op::Constant { .. } => {
                    if node.ty.rank() != 0 {
                        return Err(err("constants are 0-d".into()));
                    }
                }
                op => {
                    let types: Vec<&TensorType> = node.inputs.iter().map(|&i| self.ty(i)).collect();
                    let ty = infer_type(op, &types).map_err(|e| err(e.to_string()))?;
                    if ty != node.ty {
                        return Err(err(format!(
                            "recorded type {} but the rule gives {ty}",
                            node.ty
                        )));
                    }
                }
            }
        }
        if let Some(bad) = self.outputs.iter().find(|o| o.index() >= self.nodes.len()) {
            return Err(IrError::Verify {
                node: bad.0,
                message: "output does not exist".into(),
            });
        }
        Ok(())
    }
}

/// The stable text format: one node per line, like an FX graph's code.
impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let params: Vec<String> = (0..self.inputs.len())
            .map(|i| format!("{}: {}", self.input_name(i), self.ty(self.inputs[i])))
            .collect();
        writeln!(f, "graph({}) {{", params.join(", "))?;
        // Operands are written one by one, not gathered into strings first: a training step's
        // `grad` nodes each list every parameter, so they hold most of a deep model's operands.
        let list = |f: &mut fmt::Formatter<'_>, ids: &[NodeId]| -> fmt::Result {
            for (k, id) in ids.iter().enumerate() {
                if k > 0 {
                    f.write_str(", ")?;
                }
                // `%{id}`, its digits made here rather than through the formatting machinery.
                let mut text = [0u8; 11];
                let (mut at, mut n) = (text.len(), id.0);
                loop {
                    at -= 1;
                    text[at] = b'0' + (n % 10) as u8;
                    n /= 10;
                    if n == 0 {
                        break;
                    }
                }
                at -= 1;
                text[at] = b'%';
                f.write_str(std::str::from_utf8(&text[at..]).expect("ASCII digits"))?;
            }
            Ok(())
        };
        for (index, node) in self.nodes.iter().enumerate() {
            write!(f, "  %{index} = {}", node.op)?;
            if !node.inputs.is_empty() {
                f.write_str(" ")?;
            }
            list(f, &node.inputs)?;
            writeln!(f, " : {}", node.ty)?;
        }
        f.write_str("  return ")?;
        list(f, &self.outputs)?;
        f.write_str("\n}")
    }
}
