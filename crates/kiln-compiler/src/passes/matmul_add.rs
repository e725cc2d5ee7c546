//! MatMul + Add(constant bias) becomes one node: a `Gemm` with `C = bias` when both operands
//! are 2-D f32/f64 (the same GEMM kernel, then the same single f32/f64 addition), otherwise a
//! `MatMul` with the bias as its third input (added with the `Add` op's own evaluation). The
//! bias must broadcast along the last axis only (shape `[N]` or `[1, .., 1, N]`, no larger
//! rank than the product), so the output shape is the product's.

use super::edit::{Index, binary, dtype_of, remove_nodes, shape_of};
use crate::CompileError;
use kiln_ir::{Dim, Graph, Node, NodeKind, Op, ValueId};
use kiln_ops::elementwise::BinaryOp;
use kiln_ops::nn::{Gemm, NnOp};
use kiln_tensor::DType;

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let index = Index::new(g);
    let mut plans = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        if let Some(p) = plan(g, &index, i, node) {
            plans.push(p);
        }
    }
    let mut dead = vec![false; g.nodes.len()];
    for p in &plans {
        if let Some(node) = g.nodes.get_mut(p.matmul) {
            node.inputs.truncate(2);
            node.inputs.push(Some(p.bias));
            node.outputs = vec![Some(p.output)];
            if p.gemm {
                node.kind = NodeKind::Op(Op::Nn(NnOp::Gemm(Gemm::default())));
            }
        }
        if let Some(d) = dead.get_mut(p.add) {
            *d = true;
        }
    }
    remove_nodes(g, &dead);
    Ok(plans.len())
}

struct Plan {
    add: usize,
    matmul: usize,
    bias: ValueId,
    output: ValueId,
    gemm: bool,
}

fn plan(g: &Graph, index: &Index, i: usize, node: &Node) -> Option<Plan> {
    let (BinaryOp::Add, a, b) = binary(node)? else {
        return None;
    };
    let y = node.outputs.first().copied().flatten()?;
    let is_matmul = |v: ValueId| -> Option<usize> {
        let p = index.producer(v)?;
        let prod = g.nodes.get(p)?;
        match &prod.kind {
            NodeKind::Op(Op::Nn(NnOp::MatMul(_)))
                if prod.activation().is_none() && prod.inputs.len() == 2 && index.sole_use(v, i) =>
            {
                Some(p)
            }
            _ => None,
        }
    };
    let (mm_out, bias, p) = match (is_matmul(a), is_matmul(b)) {
        (Some(p), _) if index.tensor(g, b).is_some() => (a, b, p),
        (_, Some(p)) if index.tensor(g, a).is_some() => (b, a, p),
        _ => return None,
    };
    let t = index.tensor(g, bias)?;
    let dtype = dtype_of(g, mm_out)?;
    if t.dtype() != dtype || !super::edit::is_float(dtype) {
        return None;
    }
    let out_shape = shape_of(g, mm_out)?;
    let Some(Dim::Fixed(n)) = out_shape.last() else {
        return None;
    };
    let bs = t.shape();
    let last_only = bs.len() <= out_shape.len() && bs.last() == Some(n) && bs.iter().rev().skip(1).all(|&d| d == 1);
    if !last_only {
        return None;
    }
    let mm = g.nodes.get(p)?;
    let two_d = mm
        .inputs
        .iter()
        .all(|v| v.and_then(|v| shape_of(g, v)).is_some_and(|s| s.len() == 2));
    Some(Plan {
        add: i,
        matmul: p,
        bias,
        output: y,
        gemm: two_d && matches!(dtype, DType::F32 | DType::F64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use kiln_ops::nn::MatMul;

    fn matmul() -> Op {
        Op::Nn(NnOp::MatMul(MatMul::default()))
    }

    #[test]
    fn two_d_matmul_add_becomes_gemm_bit_exact() {
        let mut b = Builder::new();
        let x = b.input("x", &[3, 5]);
        let w = b.constant("w", noise(&[5, 4], 1));
        let bias = b.constant("bias", noise(&[4], 2));
        let m = b.node(matmul(), &[Some(x), Some(w)], &[&[3, 4]])[0];
        let y = b.binary(BinaryOp::Add, bias, m, &[3, 4]);
        let mut g = b.finish(&[y]);
        let before = g.clone();
        assert_eq!(run(&mut g).unwrap(), 1);
        g.verify().unwrap();
        assert_eq!(op_names(&g), ["Gemm"]);
        let xin = noise(&[3, 5], 3);
        assert_eq!(run_graph(&g, vec![xin.clone()]), run_graph(&before, vec![xin]));
    }

    #[test]
    fn batched_matmul_add_takes_a_bias_input_bit_exact() {
        let mut b = Builder::new();
        let x = b.input("x", &[2, 3, 5]);
        let w = b.constant("w", noise(&[5, 4], 1));
        let bias = b.constant("bias", noise(&[1, 1, 4], 2));
        let m = b.node(matmul(), &[Some(x), Some(w)], &[&[2, 3, 4]])[0];
        let y = b.binary(BinaryOp::Add, m, bias, &[2, 3, 4]);
        // A second Add on a matrix bias (not along the last axis only) is left alone.
        let w2 = b.constant("w2", noise(&[4, 4], 4));
        let m2 = b.node(matmul(), &[Some(y), Some(w2)], &[&[2, 3, 4]])[0];
        let full = b.constant("full", noise(&[3, 4], 5));
        let z = b.binary(BinaryOp::Add, m2, full, &[2, 3, 4]);
        let mut g = b.finish(&[z]);
        let before = g.clone();
        assert_eq!(run(&mut g).unwrap(), 1);
        g.verify().unwrap();
        assert_eq!(op_names(&g), ["MatMul", "MatMul", "Add"]);
        assert_eq!(g.nodes[0].inputs.len(), 3);
        let xin = noise(&[2, 3, 5], 3);
        assert_eq!(run_graph(&g, vec![xin.clone()]), run_graph(&before, vec![xin]));
    }
}
