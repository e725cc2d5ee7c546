//! float16 models compute in f32: every node of a promotable op whose float values are all
//! float16 runs on f32 values instead, its float16 constants converted once here (exactly)
//! and its other float16 inputs cast up where they enter; where a promoted value leaves the
//! region (a graph output, a node that stays float16, a subgraph capture) a Cast back to
//! float16 restores it, and dce drops the casts no one reads. So a model converted to float16
//! (onnxconverter-common's kind: weights and activations float16, often with float32 I/O)
//! takes every f32 fast path (packed and Winograd convolutions, GEMM epilogues, layout,
//! fusions) with its weights converted and packed at compile time.
//!
//! Only graphs with float16 weights (a Conv, ConvTranspose, MatMul or Gemm reading a constant)
//! are converted: those are float16 models; float16 arithmetic on activations alone keeps
//! the rounding of every op.
//!
//! Rounding: inside a region values keep f32 precision between ops instead of being rounded
//! to float16 after each, as ONNX Runtime's CPU provider does when it runs float16 nodes on
//! float32 kernels; values are rounded to float16 where they leave it. Level 1 and below run
//! the model as written, every op rounding its output to float16.
//!
//! Promotable: ops whose definition is the same function in any float type and that take no
//! dtype from an attribute: elementwise arithmetic and activations, convolutions, pooling,
//! MatMul/Gemm, Resize, normalisations, softmax, reductions and data movement. Casts,
//! constant makers, random ops, quantization, sequences and control flow stay as they are.

use super::edit::{Index, fresh_name, op};
use crate::CompileError;
use kiln_ir::{Graph, Node, NodeKind, Op, ValueId, ValueType};
use kiln_ops::elementwise::{Cast, ElementwiseOp};
use kiln_ops::movement::{Identity, MovementOp};
use kiln_ops::nn::NnOp;
use kiln_ops::reduce::ReduceOp;
use kiln_ops::{TensorType, Value};
use kiln_tensor::DType;
use kiln_tensor::formats::RoundMode;
use std::collections::HashMap;

pub(crate) fn run(g: &mut Graph) -> Result<usize, CompileError> {
    let index = Index::new(g);
    let promote: Vec<bool> = g.nodes.iter().map(|n| promotable(g, n)).collect();
    let count = promote.iter().filter(|&&p| p).count();
    // Only a model with float16 weights (a Conv, MatMul or Gemm of a constant) is a float16
    // model to run in f32; a graph of float16 activations alone keeps its per-op rounding.
    let weighted = g.nodes.iter().zip(&promote).any(|(n, &p)| {
        p && matches!(
            op(n),
            Some(Op::Nn(
                NnOp::Conv(_) | NnOp::ConvTranspose(_) | NnOp::MatMul(_) | NnOp::Gemm(_)
            ))
        ) && n.inputs.iter().flatten().any(|&v| index.tensor(g, v).is_some())
    });
    if count == 0 || !weighted {
        return Ok(0);
    }
    // float16 value -> its f32 twin, for values produced by promoted nodes, converted
    // constants and casts made here.
    let mut up: HashMap<ValueId, ValueId> = HashMap::new();
    // Values the model narrows from f32 (a Cast to float16 of an f32 value) -> that f32 value.
    let narrowed: HashMap<ValueId, ValueId> = g
        .nodes
        .iter()
        .filter_map(|n| {
            let x = cast_to(n, DType::F16).filter(|&x| dtype(g, x) == Some(DType::F32))?;
            Some((n.outputs.first().copied().flatten()?, x))
        })
        .collect();
    let old = std::mem::take(&mut g.nodes);
    let mut nodes = Vec::with_capacity(old.len() + 2 * count);
    for (mut node, promoted) in old.into_iter().zip(promote) {
        // A model's Cast back to f32 of a promoted value reads its twin: no round trip
        // through float16 (ONNX Runtime drops such cast pairs too).
        if let Some(x) = cast_to(&node, DType::F32)
            && let Some(&t) = up.get(&x)
        {
            node.kind = NodeKind::Op(Op::Movement(MovementOp::Identity(Identity)));
            node.inputs = vec![Some(t)];
            nodes.push(node);
            continue;
        }
        if !promoted {
            nodes.push(node);
            continue;
        }
        for slot in 0..node.inputs.len() {
            let Some(Some(v)) = node.inputs.get(slot).copied() else {
                continue;
            };
            if dtype(g, v) != Some(DType::F16) {
                continue;
            }
            let t = match (up.get(&v), narrowed.get(&v)) {
                (Some(&t), _) => t,
                // The model's own Cast to float16 of an f32 value: its input is the twin.
                (None, Some(&x)) => {
                    up.insert(v, x);
                    x
                }
                (None, None) => {
                    let t = twin(g, v);
                    match index.tensor(g, v).map(|c| to_cast(DType::F32).apply(c)) {
                        // A constant: converted here, exactly.
                        Some(Ok(c)) => g.constants.push((t, Value::Tensor(c))),
                        // Anything else enters through a Cast.
                        _ => {
                            let name = fresh_name(g, &format!("{}_to_f32", g.value_name(v)));
                            nodes.push(cast(name, DType::F32, v, t));
                        }
                    }
                    up.insert(v, t);
                    t
                }
            };
            if let Some(i) = node.inputs.get_mut(slot) {
                *i = Some(t);
            }
        }
        let mut backs = Vec::new();
        for slot in 0..node.outputs.len() {
            let Some(Some(y)) = node.outputs.get(slot).copied() else {
                continue;
            };
            if dtype(g, y) != Some(DType::F16) {
                continue;
            }
            let t = twin(g, y);
            up.insert(y, t);
            if let Some(o) = node.outputs.get_mut(slot) {
                *o = Some(t);
            }
            let name = fresh_name(g, &format!("{}_to_f16", g.value_name(y)));
            backs.push(cast(name, DType::F16, t, y));
        }
        nodes.push(node);
        nodes.extend(backs);
    }
    g.nodes = nodes;
    Ok(count)
}

fn to_cast(to: DType) -> Cast {
    Cast {
        to,
        saturate: true,
        round: RoundMode::Up,
    }
}

/// The input of `node` when it is a Cast to `to`.
fn cast_to(node: &Node, to: DType) -> Option<ValueId> {
    match (&node.kind, node.inputs.as_slice()) {
        (NodeKind::Op(Op::Elementwise(ElementwiseOp::Cast(c))), [Some(x)]) if c.to == to => Some(*x),
        _ => None,
    }
}

/// A Cast of `from` to `to`, writing `into`.
fn cast(name: String, to: DType, from: ValueId, into: ValueId) -> Node {
    Node {
        name,
        kind: NodeKind::Op(Op::Elementwise(ElementwiseOp::Cast(to_cast(to)))),
        inputs: vec![Some(from)],
        outputs: vec![Some(into)],
        plan: None,
    }
}

fn dtype(g: &Graph, v: ValueId) -> Option<DType> {
    g.value(v).and_then(|i| i.ty.tensor()).and_then(|t| t.dtype)
}

/// A new f32 value of `v`'s shape.
fn twin(g: &mut Graph, v: ValueId) -> ValueId {
    let shape = g.value(v).and_then(|i| i.ty.tensor()).and_then(|t| t.shape.clone());
    let name = fresh_name(g, &format!("{}_f32", g.value_name(v)));
    g.add_value(
        name,
        ValueType::Tensor(TensorType {
            dtype: Some(DType::F32),
            shape,
        }),
    )
}

/// Whether `node` runs on f32 instead: a promotable op with a float16 value among its inputs
/// or outputs and no float value of another type (f32 scales of a Resize excepted).
fn promotable(g: &Graph, node: &Node) -> bool {
    let Some(op) = op(node) else { return false };
    let kind_ok = match op {
        Op::Elementwise(e) => matches!(
            e,
            ElementwiseOp::Unary(_)
                | ElementwiseOp::Binary(_)
                | ElementwiseOp::Variadic(_)
                | ElementwiseOp::Clip(_)
                | ElementwiseOp::Where(_)
                | ElementwiseOp::PRelu(_)
        ),
        Op::Nn(n) => matches!(
            n,
            NnOp::Conv(_)
                | NnOp::ConvTranspose(_)
                | NnOp::Pool(_)
                | NnOp::GlobalPool(_)
                | NnOp::MatMul(_)
                | NnOp::Gemm(_)
                | NnOp::Resize(_)
        ),
        Op::Reduce(r) => matches!(
            r,
            ReduceOp::Reduce(_)
                | ReduceOp::Softmax(_)
                | ReduceOp::LayerNormalization(_)
                | ReduceOp::GroupNormalization(_)
                | ReduceOp::InstanceNormalization(_)
                | ReduceOp::BatchNormalization(_)
        ),
        Op::Movement(m) => !matches!(
            m,
            MovementOp::ConstantOfShape(_) | MovementOp::EyeLike(_) | MovementOp::Range(_) | MovementOp::OneHot(_)
        ),
        _ => false,
    };
    if !kind_ok {
        return false;
    }
    let values = node.inputs.iter().chain(node.outputs.iter()).flatten();
    let mut any_f16 = false;
    for &v in values {
        match dtype(g, v) {
            Some(DType::F16) => any_f16 = true,
            Some(d) if d.is_float() && !(d == DType::F32 && matches!(op, Op::Nn(NnOp::Resize(_)))) => return false,
            None if g.value(v).is_some_and(|i| !matches!(i.ty, ValueType::Tensor(_))) => return false,
            _ => {}
        }
    }
    any_f16
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testutil::*;
    use kiln_ops::elementwise::{BinaryOp, UnaryOp};
    use kiln_ops::nn::Conv;
    use kiln_tensor::{Tensor, f16};

    fn halves(t: &Tensor) -> Tensor {
        let v: Vec<f16> = t.to_f64_vec().into_iter().map(f16::from_f64).collect();
        Tensor::from_vec(t.shape().to_vec(), v).unwrap()
    }

    #[test]
    fn float16_regions_run_in_f32_with_casts_at_their_borders() {
        // x f16 -> Conv (f16 weights) -> Relu -> Add(f16 const) -> y f16, and Relu's output is
        // also read by a Cast to f32 (a node that stays as it is) -> z f32.
        let mut b = Builder::new();
        let x = b.input_typed("x", DType::F16, &[1, 2, 5, 5]);
        let w = b.constant("w", halves(&noise(&[3, 2, 3, 3], 1)));
        let k = b.constant("k", halves(&noise(&[1, 3, 1, 1], 2)));
        let conv = Op::Nn(NnOp::Conv(Conv {
            pads: vec![1; 4],
            group: 1,
            ..Conv::default()
        }));
        let s: &[usize] = &[1, 3, 5, 5];
        let c = b.node_typed(conv, &[Some(x), Some(w)], &[(DType::F16, s)])[0];
        let r = b.node_typed(
            Op::Elementwise(ElementwiseOp::Unary(UnaryOp::Relu)),
            &[Some(c)],
            &[(DType::F16, s)],
        )[0];
        let y = b.node_typed(binary(BinaryOp::Add), &[Some(r), Some(k)], &[(DType::F16, s)])[0];
        let z = b.node_typed(
            Op::Elementwise(ElementwiseOp::Cast(to_cast(DType::F32))),
            &[Some(r)],
            &[(DType::F32, s)],
        )[0];
        let mut g = b.finish(&[y, z]);
        let before = g.clone();
        assert_eq!(run(&mut g).unwrap(), 3);
        crate::passes::dce::run(&mut g).unwrap();
        g.verify().unwrap();
        // One cast in, Conv/Relu/Add in f32, a cast back for y; the model's Cast of Relu's
        // output to f32 reads the f32 value as it is.
        assert_eq!(op_names(&g), ["Cast", "Conv", "Relu", "Add", "Cast", "Identity"]);
        let f32_nodes = g.nodes.iter().filter(|n| !matches!(n.kind.name(), "Cast"));
        for n in f32_nodes {
            for v in n.inputs.iter().chain(&n.outputs).flatten() {
                assert_eq!(dtype(&g, *v), Some(DType::F32), "{}", n.name);
            }
        }
        let xin = halves(&noise(&[1, 2, 5, 5], 3));
        let (got, want) = (run_graph(&g, vec![xin.clone()]), run_graph(&before, vec![xin]));
        for (a, b) in got.iter().zip(&want) {
            assert_eq!(a.dtype(), b.dtype());
            // float16 rounding: the reference rounds after each op, the region once at its end.
            assert_close(a, b, 2e-3);
        }
    }
}
