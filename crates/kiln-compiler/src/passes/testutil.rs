//! Test helpers: small graphs built in code, and running a graph through lowering and the
//! runtime to compare results before and after a pass.

use kiln_ir::{Graph, Node, NodeKind, Op, ValueId, ValueType};
use kiln_ops::elementwise::{Binary, BinaryOp, ElementwiseOp, UnaryOp};
use kiln_ops::movement::{ConstantOfShape, MovementOp, Reshape};
use kiln_ops::{TensorType, Value};
use kiln_tensor::{DType, Tensor};

pub(crate) struct Builder {
    pub g: Graph,
    n: usize,
}

impl Builder {
    pub fn new() -> Builder {
        Builder {
            g: Graph {
                name: "test".into(),
                ..Graph::default()
            },
            n: 0,
        }
    }

    pub fn input(&mut self, name: &str, shape: &[usize]) -> ValueId {
        self.input_typed(name, DType::F32, shape)
    }

    pub fn input_typed(&mut self, name: &str, dtype: DType, shape: &[usize]) -> ValueId {
        let id = self
            .g
            .add_value(name, ValueType::Tensor(TensorType::fixed(dtype, shape)));
        self.g.inputs.push(id);
        id
    }

    pub fn constant(&mut self, name: &str, t: Tensor) -> ValueId {
        let id = self.g.add_value(name, ValueType::Tensor(TensorType::of(&t)));
        self.g.constants.push((id, Value::Tensor(t)));
        id
    }

    /// A node with f32 outputs of the given shapes.
    pub fn node(&mut self, op: Op, inputs: &[Option<ValueId>], outs: &[&[usize]]) -> Vec<ValueId> {
        let typed: Vec<(DType, &[usize])> = outs.iter().map(|s| (DType::F32, *s)).collect();
        self.node_typed(op, inputs, &typed)
    }

    pub fn node_typed(&mut self, op: Op, inputs: &[Option<ValueId>], outs: &[(DType, &[usize])]) -> Vec<ValueId> {
        self.n += 1;
        let name = format!("n{}_{}", self.n, op.name());
        let outputs: Vec<ValueId> = outs
            .iter()
            .enumerate()
            .map(|(k, (d, s))| {
                self.g
                    .add_value(format!("{name}_out{k}"), ValueType::Tensor(TensorType::fixed(*d, s)))
            })
            .collect();
        self.g.nodes.push(Node {
            name,
            kind: NodeKind::Op(op),
            inputs: inputs.to_vec(),
            outputs: outputs.iter().map(|&o| Some(o)).collect(),
            plan: None,
        });
        outputs
    }

    /// [`Builder::node`], then `act` fused into it (a Conv, MatMul or Gemm).
    pub fn node_act(
        &mut self,
        op: Op,
        act: Option<kiln_ops::nn::Activation>,
        inputs: &[Option<ValueId>],
        outs: &[&[usize]],
    ) -> Vec<ValueId> {
        let out = self.node(op, inputs, outs);
        self.activate(act);
        out
    }

    /// Fuses `act` into the last node added (a Conv, MatMul or Gemm), as `fuse_act` would.
    pub fn activate(&mut self, act: Option<kiln_ops::nn::Activation>) {
        if let Some(plan) = self.g.nodes.last_mut().and_then(Node::plan_mut) {
            plan.set_activation(act);
        }
    }

    pub fn binary(&mut self, op: BinaryOp, a: ValueId, b: ValueId, shape: &[usize]) -> ValueId {
        self.node(binary(op), &[Some(a), Some(b)], &[shape])[0]
    }

    pub fn unary(&mut self, op: UnaryOp, x: ValueId, shape: &[usize]) -> ValueId {
        self.node(Op::Elementwise(ElementwiseOp::Unary(op)), &[Some(x)], &[shape])[0]
    }

    pub fn finish(mut self, outputs: &[ValueId]) -> Graph {
        self.g.outputs = outputs.to_vec();
        self.g.verify().unwrap();
        self.g
    }
}

pub(crate) fn binary(op: BinaryOp) -> Op {
    Op::Elementwise(ElementwiseOp::Binary(Binary { op, legacy_axis: None }))
}

pub(crate) fn reshape() -> Op {
    Op::Movement(MovementOp::Reshape(Reshape {
        shape: None,
        allowzero: false,
    }))
}

pub(crate) fn constant_of_shape() -> Op {
    Op::Movement(MovementOp::ConstantOfShape(ConstantOfShape { value: None }))
}

pub(crate) fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_vec(shape.to_vec(), v.to_vec()).unwrap()
}

/// Deterministic pseudo-random f32 values in [-1, 1).
pub(crate) fn noise(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let v: Vec<f32> = (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    f32s(shape, &v)
}

/// The op names of the graph's nodes, in order.
pub(crate) fn op_names(g: &Graph) -> Vec<&'static str> {
    g.nodes.iter().map(|n| n.kind.name()).collect()
}

/// Lowers and runs the graph on `inputs` (in graph-input order), returning its outputs.
pub(crate) fn run_graph(g: &Graph, inputs: Vec<Tensor>) -> Vec<Tensor> {
    let program = crate::lower(g).unwrap();
    let named = g
        .inputs
        .iter()
        .zip(inputs)
        .map(|(&id, t)| (g.value_name(id).to_string(), Value::Tensor(t)))
        .collect();
    kiln_runtime::run(&program, named)
        .unwrap()
        .into_iter()
        .map(|(_, v)| v.as_tensor().unwrap().clone())
        .collect()
}

/// Asserts two tensors are equal within `rtol` relative to the largest magnitude.
pub(crate) fn assert_close(a: &Tensor, b: &Tensor, rtol: f64) {
    assert_eq!(a.shape(), b.shape());
    let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
    let scale = y.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-30);
    for (p, q) in x.iter().zip(&y) {
        assert!((p - q).abs() <= rtol * scale, "{p} vs {q} (scale {scale})");
    }
}

/// A per-tensor QuantizeLinear (axis 1, saturating, the zero point's type).
pub(crate) fn quantize() -> Op {
    Op::Quant(kiln_ops::quant::QuantOp::QuantizeLinear(
        kiln_ops::quant::QuantizeLinear {
            axis: 1,
            saturate: true,
            block_size: 0,
            output_dtype: None,
            precision: None,
        },
    ))
}

/// A DequantizeLinear along `axis` (per axis when its scale has one value per index).
pub(crate) fn dequantize(axis: i64) -> Op {
    Op::Quant(kiln_ops::quant::QuantOp::DequantizeLinear(
        kiln_ops::quant::DequantizeLinear {
            axis,
            block_size: 0,
            output_dtype: None,
        },
    ))
}

/// A 2-D Conv of `group` groups, square `pads` and `stride`.
pub(crate) fn conv2d(group: usize, pads: usize, stride: usize) -> Op {
    Op::Nn(kiln_ops::nn::NnOp::Conv(kiln_ops::nn::Conv {
        group,
        pads: vec![pads; 4],
        strides: vec![stride; 2],
        ..Default::default()
    }))
}
