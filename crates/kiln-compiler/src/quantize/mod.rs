//! Post-training quantization of an f32 graph (qaic's `convert_to_quantize`, Axelera's
//! `quantize_and_lower`): pure graph work, no I/O; the Session's side (calibration runs,
//! profiles, the accuracy report) is `crates/kiln/src/quantize.rs`.
//!
//! 1. [`prepare`] cleans the graph as the compiler would (constant folding, BatchNorm folded
//!    into its Conv/Gemm) so the weights quantized are the weights that run.
//! 2. [`targets`] names the activations to calibrate: the float inputs of every quantizable node
//!    (Conv, ConvTranspose, MatMul, Gemm, a residual Add before a Relu, MaxPool) that are not
//!    constants.
//! 3. The caller profiles them into [`calib::Histogram`]s and picks ranges with a
//!    [`calib::Method`].
//! 4. [`quantize`] writes QDQ: each target activation passes through one
//!    QuantizeLinear -> DequantizeLinear pair (shared by all its quantized readers), each constant
//!    weight becomes an 8-bit constant with its DequantizeLinear (per tensor, or per output
//!    channel / feature), each bias an int32 (scale = input scale x weight scale) or int8
//!    constant. The compiler's passes then make what they can integer (`qdq_matmul`) and fold
//!    the rest; the graph computes what ONNX's QDQ semantics say.

pub mod calib;
pub mod params;

use crate::CompileError;
use crate::passes::edit::{Index, add_constant, dtype_of, fixed_shape, fresh_name};
use calib::Method;
use kiln_ir::{Graph, Node, NodeKind, Op, ValueId, ValueType};
use kiln_ops::elementwise::{Binary, BinaryOp, ElementwiseOp, UnaryOp};
use kiln_ops::nn::{NnOp, Pool, PoolKind};
use kiln_ops::quant::{DequantizeLinear, QuantOp, QuantizeLinear};
use kiln_tensor::{DType, Tensor};
use params::{QParams, Schema};
use std::collections::HashMap;

/// What to quantize and how (typed from qaic's and Axelera's options by the Session).
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// Schema of activations (`quantization_schema_activations`).
    pub activations: Schema,
    /// Schema of per-tensor constants (`quantization_schema_constants`).
    pub constants: Schema,
    /// Calibration method (`quantization_calibration`).
    pub method: Method,
    /// Histogram bins (`num_histogram_bins`).
    pub bins: usize,
    /// Biases in int32 (scale = input scale x weight scale); int8 otherwise.
    pub bias_int32: bool,
    /// Conv / ConvTranspose weights per output channel (`enable_channelwise`).
    pub channelwise: bool,
    /// Depthwise Conv weights per channel (`quantize_dw_channel_wise`; implied by `channelwise`).
    pub depthwise_channelwise: bool,
    /// MatMul / Gemm constant weights per output feature (`enable_rowwise`).
    pub rowwise: bool,
    /// Op types left in float (`keep_original_precision_for_nodes`), as `Op::name` spells them.
    pub keep: Vec<String>,
}

impl Default for Spec {
    fn default() -> Spec {
        Spec {
            activations: Schema::SymmetricWithUint8,
            constants: Schema::SymmetricWithUint8,
            method: Method::MinMax,
            bins: 512,
            bias_int32: true,
            channelwise: false,
            depthwise_channelwise: false,
            rowwise: false,
            keep: Vec::new(),
        }
    }
}

/// The op types [`quantize`] rewrites.
pub const QUANTIZABLE: &[&str] = &["Conv", "ConvTranspose", "MatMul", "Gemm", "Add", "MaxPool"];

/// What [`quantize`] did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Nodes whose inputs were quantized, by op type.
    pub nodes: Vec<(&'static str, usize)>,
    /// Activations given a QuantizeLinear -> DequantizeLinear pair.
    pub activations: usize,
    /// Constant weights stored in 8 bits.
    pub weights: usize,
    /// Of those, per channel / per feature.
    pub per_channel: usize,
    /// Biases stored as int32 or int8.
    pub biases: usize,
    /// Nodes of a quantizable type left in float, with the reason.
    pub kept: Vec<(String, String)>,
}

/// Cleans `graph` for quantization: the level-1 passes and BatchNorm folding.
pub fn prepare(graph: &mut Graph) -> Result<(), CompileError> {
    crate::pipeline::prepare_for_quantization(graph)
}

/// Which inputs of a node are quantized: activation positions, the weight position and the
/// axis of its output channels / features, the bias position.
struct Roles {
    op: &'static str,
    activations: Vec<usize>,
    weight: Option<(usize, Option<usize>)>,
    bias: Option<usize>,
}

fn roles(g: &Graph, index: &Index, node: &Node, spec: &Spec) -> Option<Roles> {
    let NodeKind::Op(op) = &node.kind else { return None };
    if node.plan.is_some() {
        return None;
    }
    let name = op.name();
    if spec.keep.iter().any(|k| k == name) {
        return None;
    }
    let is_const = |i: usize| {
        node.inputs
            .get(i)
            .copied()
            .flatten()
            .is_some_and(|v| index.tensor(g, v).is_some())
    };
    let float = |i: usize| {
        node.inputs
            .get(i)
            .copied()
            .flatten()
            .is_some_and(|v| dtype_of(g, v) == Some(DType::F32))
    };
    if !node
        .outputs
        .iter()
        .flatten()
        .all(|&v| dtype_of(g, v) == Some(DType::F32))
        || !float(0)
    {
        return None;
    }
    let split = |weights: usize, axis: Option<usize>, bias: Option<usize>| {
        if !float(weights) {
            return None;
        }
        let mut activations = vec![0];
        let weight = if is_const(weights) {
            Some((weights, axis))
        } else {
            activations.push(weights);
            None
        };
        Some(Roles {
            op: name,
            activations,
            weight,
            bias: bias.filter(|&b| is_const(b) && float(b)),
        })
    };
    match op {
        Op::Nn(NnOp::Conv(c)) => {
            let w = node.inputs.get(1).copied().flatten().and_then(|v| index.tensor(g, v));
            let depthwise = c.group > 1 && w.is_some_and(|w| w.shape().get(1) == Some(&1));
            let per_channel = spec.channelwise || depthwise && spec.depthwise_channelwise;
            split(1, per_channel.then_some(0), Some(2))
        }
        Op::Nn(NnOp::ConvTranspose(c)) => split(1, (spec.channelwise && c.group == 1).then_some(1), Some(2)),
        Op::Nn(NnOp::MatMul(_)) => {
            let rank2 = node
                .inputs
                .get(1)
                .copied()
                .flatten()
                .and_then(|v| index.tensor(g, v))
                .is_some_and(|t| t.rank() == 2);
            split(1, (spec.rowwise && rank2).then_some(1), None)
        }
        Op::Nn(NnOp::Gemm(gm)) => split(
            1,
            spec.rowwise.then_some(if gm.trans_b { 0 } else { 1 }),
            (gm.beta == 1.0).then_some(2),
        ),
        // A residual sum before a Relu (a post-activation block, as ResNet's): two
        // activations of one fixed shape (not a bias or a broadcast) whose sum only a Relu
        // reads. Quantizing both makes the convolutions that feed it end on a QuantizeLinear
        // (so they run in 8 bits) and the sum with its Relu one 8-bit op (`qdq_add`). A linear
        // sum (MobileNetV2's bottlenecks, transformers) stays float: quantized, it cost
        // MobileNetV2 0.3 dB of output SQNR and put kiln's MinMax below ONNX Runtime's.
        Op::Elementwise(ElementwiseOp::Binary(Binary {
            op: BinaryOp::Add,
            legacy_axis: None,
        })) => {
            let shape = |i: usize| node.inputs.get(i).copied().flatten().and_then(|v| fixed_shape(g, v));
            let relu = |r: &usize| {
                g.nodes.get(*r).is_some_and(|n| {
                    matches!(
                        n.kind,
                        NodeKind::Op(Op::Elementwise(ElementwiseOp::Unary(UnaryOp::Relu)))
                    )
                })
            };

            let before_relu = match node.outputs.as_slice() {
                [Some(y)] => !index.is_output(*y) && matches!(index.readers(*y), [r] if relu(r)),
                _ => false,
            };
            let residual =
                before_relu && float(1) && !is_const(0) && !is_const(1) && shape(0).is_some() && shape(0) == shape(1);
            residual.then(|| Roles {
                op: name,
                activations: vec![0, 1],
                weight: None,
                bias: None,
            })
        }
        // Its input quantized, the convolution before it ends on a QuantizeLinear (a ResNet
        // stem: Conv, Relu, MaxPool) and runs in 8 bits; the pool reads the dequantized grid.
        Op::Nn(NnOp::Pool(Pool {
            kind: PoolKind::Max { .. },
            ..
        })) if node.outputs.len() == 1 => Some(Roles {
            op: name,
            activations: vec![0],
            weight: None,
            bias: None,
        }),
        _ => None,
    }
}

/// The activations to calibrate: every non-constant f32 input of a quantizable node, once, in
/// graph order.
pub fn targets(g: &Graph, spec: &Spec) -> Vec<ValueId> {
    let index = Index::new(g);
    let mut out: Vec<ValueId> = Vec::new();
    for node in &g.nodes {
        let Some(r) = roles(g, &index, node, spec) else {
            continue;
        };
        for &i in &r.activations {
            if let Some(v) = node.inputs.get(i).copied().flatten()
                && !out.contains(&v)
            {
                out.push(v);
            }
        }
    }
    out
}

/// Rewrites `g` with QDQ around its quantizable nodes, each target activation quantized on the
/// grid of its range in `ranges` (an activation without a range is left in float, and so is its
/// reader's bias).
pub fn quantize(g: &mut Graph, spec: &Spec, ranges: &HashMap<ValueId, (f32, f32)>) -> Result<Summary, CompileError> {
    let index = Index::new(g);
    let mut summary = Summary::default();
    let mut pairs: HashMap<ValueId, (ValueId, QParams)> = HashMap::new();
    // Roles read the whole graph (a sum's readers), so they are found before it is taken apart.
    let mut plans: Vec<(usize, Roles)> = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        if let Some(r) = roles(g, &index, node, spec) {
            plans.push((i, r));
        }
    }
    let old = std::mem::take(&mut g.nodes);
    let mut nodes: Vec<Node> = Vec::with_capacity(old.len() * 2);
    let mut plans = plans.into_iter().peekable();
    for (i, mut node) in old.into_iter().enumerate() {
        let Some((_, r)) = plans.next_if(|(k, _)| *k == i) else {
            nodes.push(node);
            continue;
        };
        // Every activation needs a range, or the node stays float.
        let missing = r
            .activations
            .iter()
            .filter_map(|&a| node.inputs.get(a).copied().flatten())
            .find(|v| !ranges.contains_key(v));
        if let Some(v) = missing {
            summary.kept.push((
                node.name.clone(),
                format!("no calibrated range for its input '{}'", g.value_name(v)),
            ));
            nodes.push(node);
            continue;
        }
        let mut input_scale: Option<f32> = None;
        for &a in &r.activations {
            let Some(v) = node.inputs.get(a).copied().flatten() else {
                continue;
            };
            let (dq, p) = match pairs.get(&v) {
                Some(&pair) => pair,
                None => {
                    let (lo, hi) = ranges.get(&v).copied().unwrap_or((0.0, 0.0));
                    let p = params::choose(f64::from(lo), f64::from(hi), spec.activations);
                    let dq = qdq_pair(g, &mut nodes, v, p)?;
                    summary.activations += 1;
                    pairs.insert(v, (dq, p));
                    (dq, p)
                }
            };
            if a == 0 {
                input_scale = Some(p.scale);
            }
            if let Some(slot) = node.inputs.get_mut(a) {
                *slot = Some(dq);
            }
        }
        let mut weight_scales: Option<Vec<f32>> = None;
        if let Some((w, axis)) = r.weight
            && let Some(wv) = node.inputs.get(w).copied().flatten()
            && let Some(t) = index.tensor(g, wv).cloned()
        {
            let (dq, scales) = quantize_weight(g, &mut nodes, wv, &t, axis, spec.constants, &node.name)?;
            summary.weights += 1;
            if scales.len() > 1 {
                summary.per_channel += 1;
            }
            weight_scales = Some(scales);
            if let Some(slot) = node.inputs.get_mut(w) {
                *slot = Some(dq);
            }
        }
        if let Some(b) = r.bias
            && let Some(bv) = node.inputs.get(b).copied().flatten()
            && let Some(t) = index.tensor(g, bv).cloned()
        {
            let dq = if spec.bias_int32 {
                match (input_scale, &weight_scales) {
                    (Some(sx), Some(sw)) => quantize_bias_i32(g, &mut nodes, bv, &t, sx, sw)?,
                    _ => None,
                }
            } else {
                Some(quantize_weight(g, &mut nodes, bv, &t, None, Schema::Symmetric, &node.name)?.0)
            };
            if let Some(dq) = dq {
                summary.biases += 1;
                if let Some(slot) = node.inputs.get_mut(b) {
                    *slot = Some(dq);
                }
            }
        }
        match summary.nodes.iter_mut().find(|(op, _)| *op == r.op) {
            Some((_, n)) => *n += 1,
            None => summary.nodes.push((r.op, 1)),
        }
        nodes.push(node);
    }
    g.nodes = nodes;
    g.verify()?;
    Ok(summary)
}

/// The 8-bit type of a float value of type `ty` on grid `p`, and the grid's scale and zero
/// point as constants named after `base`.
fn grid_of(g: &mut Graph, base: &str, ty: &ValueType, p: &QParams) -> (ValueType, ValueId, ValueId) {
    let q_ty = match ty {
        ValueType::Tensor(t) => ValueType::Tensor(kiln_ops::TensorType {
            dtype: Some(p.dtype()),
            shape: t.shape.clone(),
        }),
        other => other.clone(),
    };
    let scale = add_constant(g, &format!("{base}_scale"), scalar_f32(p.scale));
    let zp = add_constant(g, &format!("{base}_zero_point"), zero_point(p));
    (q_ty, scale, zp)
}

fn scalar_f32(v: f32) -> Tensor {
    Tensor::scalar(v)
}

fn zero_point(p: &QParams) -> Tensor {
    // The zero point is inside the type's range by construction.
    if p.unsigned {
        Tensor::scalar(p.zero_point.clamp(0, 255) as u8)
    } else {
        Tensor::scalar(p.zero_point.clamp(-128, 127) as i8)
    }
}

fn q_node(name: String, op: QuantOp, inputs: Vec<Option<ValueId>>, output: ValueId) -> Node {
    Node {
        name,
        kind: NodeKind::Op(Op::Quant(op)),
        inputs,
        outputs: vec![Some(output)],
        plan: None,
    }
}

/// QuantizeLinear per tensor, saturating, to the zero point's type.
fn quantize_op() -> QuantOp {
    QuantOp::QuantizeLinear(QuantizeLinear {
        axis: 1,
        saturate: true,
        block_size: 0,
        output_dtype: None,
        precision: None,
    })
}

fn dequantize(axis: i64) -> QuantOp {
    QuantOp::DequantizeLinear(DequantizeLinear {
        axis,
        block_size: 0,
        output_dtype: None,
    })
}

/// Adds `x -> QuantizeLinear -> DequantizeLinear` to `nodes`; returns the dequantized value.
fn qdq_pair(g: &mut Graph, nodes: &mut Vec<Node>, x: ValueId, p: QParams) -> Result<ValueId, CompileError> {
    let base = g.value_name(x).to_string();
    let ty = g
        .value(x)
        .map(|v| v.ty.clone())
        .ok_or_else(|| CompileError::Option(format!("quantize: value {} is not in the graph", x.0)))?;
    let (q_ty, scale, zp) = grid_of(g, &base, &ty, &p);
    let q_name = fresh_name(g, &format!("{base}_quantized"));
    let q = g.add_value(q_name.clone(), q_ty);
    let dq_name = fresh_name(g, &format!("{base}_dequantized"));
    let dq = g.add_value(dq_name.clone(), ty);
    nodes.push(q_node(q_name, quantize_op(), vec![Some(x), Some(scale), Some(zp)], q));
    nodes.push(q_node(dq_name, dequantize(1), vec![Some(q), Some(scale), Some(zp)], dq));
    Ok(dq)
}

/// Per-slice (min, max) of `data` along `axis` of `shape` (one slice when `axis` is `None`).
fn slice_ranges(data: &[f32], shape: &[usize], axis: Option<usize>) -> Vec<(f64, f64)> {
    let (channels, inner) = match axis {
        Some(a) => (
            shape.get(a).copied().unwrap_or(1),
            shape.get(a + 1..).map_or(1, |s| s.iter().product::<usize>()),
        ),
        None => (1, data.len().max(1)),
    };
    let channels = channels.max(1);
    let mut out = vec![(0f64, 0f64); channels];
    for (k, &x) in data.iter().enumerate() {
        let c = (k / inner.max(1)) % channels;
        if let Some(r) = out.get_mut(c)
            && x.is_finite()
        {
            r.0 = r.0.min(f64::from(x));
            r.1 = r.1.max(f64::from(x));
        }
    }
    out
}

/// Stores the f32 constant `t` in 8 bits (per tensor under `schema`, or symmetric per slice of
/// `axis`) with its DequantizeLinear; returns the dequantized value and the scales.
fn quantize_weight(
    g: &mut Graph,
    nodes: &mut Vec<Node>,
    w: ValueId,
    t: &Tensor,
    axis: Option<usize>,
    schema: Schema,
    node: &str,
) -> Result<(ValueId, Vec<f32>), CompileError> {
    let bad = |e: kiln_tensor::TensorError| CompileError::Pass {
        pass: "quantize",
        node: node.to_string(),
        message: e.to_string(),
    };
    let data = t.as_slice::<f32>().map_err(bad)?;
    let shape = t.shape().to_vec();
    let axis = axis.filter(|&a| a < shape.len() && shape.get(a).is_some_and(|&c| c > 1));
    let ranges = slice_ranges(data, &shape, axis);
    let ps: Vec<QParams> = ranges
        .iter()
        .map(|&(lo, hi)| {
            if axis.is_some() {
                params::symmetric_channel(lo, hi)
            } else {
                params::choose(lo, hi, schema)
            }
        })
        .collect();
    let unsigned = ps.first().is_some_and(|p| p.unsigned);
    let channels = ps.len().max(1);
    let inner = axis.map_or(data.len().max(1), |a| {
        shape.get(a + 1..).map_or(1, |s| s.iter().product::<usize>())
    });
    let codes: Vec<i32> = data
        .iter()
        .enumerate()
        .map(|(k, &x)| {
            let c = (k / inner.max(1)) % channels;
            ps.get(c).map_or(0, |p| p.quantize(x))
        })
        .collect();
    let base = g.value_name(w).to_string();
    let q = if unsigned {
        Tensor::from_vec(
            shape.clone(),
            codes.iter().map(|&c| c.clamp(0, 255) as u8).collect::<Vec<u8>>(),
        )
    } else {
        Tensor::from_vec(
            shape.clone(),
            codes.iter().map(|&c| c.clamp(-128, 127) as i8).collect::<Vec<i8>>(),
        )
    }
    .map_err(bad)?;
    let scales: Vec<f32> = ps.iter().map(|p| p.scale).collect();
    let (scale_t, zp_t) = if axis.is_some() {
        let zps = Tensor::from_vec(vec![channels], vec![0i8; channels]).map_err(bad)?;
        (Tensor::from_vec(vec![channels], scales.clone()).map_err(bad)?, zps)
    } else {
        let p = ps.first().copied().unwrap_or(params::choose(0.0, 0.0, schema));
        (scalar_f32(p.scale), zero_point(&p))
    };
    let qv = add_constant(g, &format!("{base}_quantized"), q);
    let sv = add_constant(g, &format!("{base}_scale"), scale_t);
    let zv = add_constant(g, &format!("{base}_zero_point"), zp_t);
    let ty = g.value(w).map(|v| v.ty.clone()).unwrap_or(ValueType::Unknown);
    let dq_name = fresh_name(g, &format!("{base}_dequantized"));
    let dq = g.add_value(dq_name.clone(), ty);
    let axis = i64::try_from(axis.unwrap_or(0)).unwrap_or(0);
    nodes.push(q_node(
        dq_name,
        dequantize(axis),
        vec![Some(qv), Some(sv), Some(zv)],
        dq,
    ));
    Ok((dq, scales))
}

/// A 1-D bias of one value per weight scale (or any bias with one weight scale) stored as int32
/// with scale `sx * sw[c]` and zero point 0; `None` when the shapes do not fit.
fn quantize_bias_i32(
    g: &mut Graph,
    nodes: &mut Vec<Node>,
    b: ValueId,
    t: &Tensor,
    sx: f32,
    sw: &[f32],
) -> Result<Option<ValueId>, CompileError> {
    let Ok(data) = t.as_slice::<f32>() else { return Ok(None) };
    let per_channel = sw.len() > 1;
    if per_channel && (t.rank() != 1 || data.len() != sw.len()) {
        return Ok(None);
    }
    let scales: Vec<f32> = if per_channel {
        sw.iter().map(|s| sx * s).collect()
    } else {
        vec![sx * sw.first().copied().unwrap_or(1.0)]
    };
    if scales.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
        return Ok(None);
    }
    // Glow keeps int32 biases within 2^30 for headroom; a bias the grid cannot hold (an
    // activation that barely varied on the samples has a tiny scale) stays in float.
    let fits = data.iter().enumerate().all(|(k, &x)| {
        let s = scales.get(if per_channel { k } else { 0 }).copied().unwrap_or(1.0);
        (f64::from(x) / f64::from(s)).abs() <= f64::from(1u32 << 30)
    });
    if !fits {
        return Ok(None);
    }
    let codes: Vec<i32> = data
        .iter()
        .enumerate()
        .map(|(k, &x)| {
            let s = scales.get(if per_channel { k } else { 0 }).copied().unwrap_or(1.0);
            let v = (f64::from(x) / f64::from(s)).round_ties_even();
            if v.is_nan() {
                0
            } else {
                v.clamp(f64::from(i32::MIN), f64::from(i32::MAX)) as i32
            }
        })
        .collect();
    let bad = |e: kiln_tensor::TensorError| CompileError::Option(format!("quantize: bias: {e}"));
    let q = Tensor::from_vec(t.shape().to_vec(), codes).map_err(bad)?;
    let scale_t = if per_channel {
        Tensor::from_vec(vec![scales.len()], scales).map_err(bad)?
    } else {
        scalar_f32(scales.first().copied().unwrap_or(1.0))
    };
    let base = g.value_name(b).to_string();
    let qv = add_constant(g, &format!("{base}_quantized"), q);
    let sv = add_constant(g, &format!("{base}_scale"), scale_t);
    let ty = g.value(b).map(|v| v.ty.clone()).unwrap_or(ValueType::Unknown);
    let dq_name = fresh_name(g, &format!("{base}_dequantized"));
    let dq = g.add_value(dq_name.clone(), ty);
    nodes.push(q_node(dq_name, dequantize(0), vec![Some(qv), Some(sv)], dq));
    Ok(Some(dq))
}

/// One program input or output that [`quantize_io`] made 8-bit: the values it carries are
/// `round(x / scale) + zero_point`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct IoQuant {
    pub name: String,
    /// "input" or "output".
    pub role: &'static str,
    pub dtype: String,
    pub scale: f32,
    pub zero_point: i32,
}

/// Axelera's `remove_io_quantization` on a graph [`quantize`] rewrote: a float input whose
/// only use is its QuantizeLinear becomes that Q's 8-bit output (under the input's name; any
/// other reader takes the dequantized value), and each float output gets a QuantizeLinear on
/// the grid of its range in `output_ranges` and is returned in 8 bits under its name.
pub fn quantize_io(
    g: &mut Graph,
    spec: &Spec,
    output_ranges: &HashMap<ValueId, (f32, f32)>,
) -> Result<Vec<IoQuant>, CompileError> {
    let mut io = Vec::new();
    let index = Index::new(g);
    let scalar = |g: &Graph, v: Option<ValueId>| -> Option<f64> {
        v.and_then(|v| index.tensor(g, v))
            .and_then(|t| t.to_f64_vec().first().copied())
    };
    let mut dead = vec![false; g.nodes.len()];
    let mut swaps: Vec<(usize, ValueId, ValueId, ValueId)> = Vec::new();
    for (slot, &x) in g.inputs.iter().enumerate() {
        if dtype_of(g, x) != Some(DType::F32) {
            continue;
        }
        // The Q of x (ours: per tensor, constant scale and zero point) and the DQ reading it.
        let q = index.readers(x).iter().copied().find(|&r| {
            g.nodes
                .get(r)
                .is_some_and(|n| matches!(n.kind, NodeKind::Op(Op::Quant(QuantOp::QuantizeLinear(_)))))
        });
        let Some(qi) = q else { continue };
        let Some(qn) = g.nodes.get(qi) else { continue };
        let Some(Some(qv)) = qn.outputs.first().copied() else {
            continue;
        };
        let dq = index.readers(qv).iter().copied().find_map(|r| {
            let n = g.nodes.get(r)?;
            matches!(n.kind, NodeKind::Op(Op::Quant(QuantOp::DequantizeLinear(_))))
                .then(|| n.outputs.first().copied().flatten())?
        });
        let Some(dqv) = dq else { continue };
        let (Some(scale), zp) = (
            scalar(g, qn.inputs.get(1).copied().flatten()),
            scalar(g, qn.inputs.get(2).copied().flatten()),
        ) else {
            continue;
        };
        io.push(IoQuant {
            name: g.value_name(x).to_string(),
            role: "input",
            dtype: dtype_of(g, qv).map_or_else(String::new, |d| d.to_string()),
            scale: scale as f32,
            zero_point: zp.unwrap_or(0.0) as i32,
        });
        if let Some(d) = dead.get_mut(qi) {
            *d = true;
        }
        swaps.push((slot, x, qv, dqv));
    }
    for &(slot, x, qv, dqv) in &swaps {
        // Other readers of x read its dequantized value; the Q goes; qv takes x's name.
        let mut map = HashMap::new();
        map.insert(x, dqv);
        crate::passes::edit::replace_all(g, &map);
        let name = g.value_name(x).to_string();
        let float_name = fresh_name(g, &format!("{name}_float"));
        if let Some(v) = g.values.get_mut(x.index()) {
            v.name = float_name;
        }
        if let Some(v) = g.values.get_mut(qv.index()) {
            v.name = name;
        }
        if let Some(s) = g.inputs.get_mut(slot) {
            *s = qv;
        }
    }
    crate::passes::edit::remove_nodes(g, &dead);
    let outputs = g.outputs.clone();
    for (slot, &y) in outputs.iter().enumerate() {
        if dtype_of(g, y) != Some(DType::F32) || g.inputs.contains(&y) {
            continue;
        }
        let Some(&(lo, hi)) = output_ranges.get(&y) else {
            continue;
        };
        let p = params::choose(f64::from(lo), f64::from(hi), spec.activations);
        let name = g.value_name(y).to_string();
        let ty = g.value(y).map(|v| v.ty.clone()).unwrap_or(ValueType::Unknown);
        let (q_ty, scale, zp) = grid_of(g, &name, &ty, &p);
        let float_name = fresh_name(g, &format!("{name}_float"));
        if let Some(v) = g.values.get_mut(y.index()) {
            v.name = float_name;
        }
        let yq = g.add_value(name.clone(), q_ty);
        g.nodes.push(q_node(
            format!("{name}_quantize"),
            quantize_op(),
            vec![Some(y), Some(scale), Some(zp)],
            yq,
        ));
        if let Some(s) = g.outputs.get_mut(slot) {
            *s = yq;
        }
        io.push(IoQuant {
            name,
            role: "output",
            dtype: p.dtype().to_string(),
            scale: p.scale,
            zero_point: p.zero_point,
        });
    }
    g.verify()?;
    Ok(io)
}
