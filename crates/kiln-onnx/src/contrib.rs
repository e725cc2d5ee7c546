//! ONNX Runtime's com.microsoft ops, the ones its transformer optimiser
//! (`onnxruntime.transformers.optimizer`) and its saved optimised graphs carry, expanded at
//! import into standard ONNX ops of opset [`OPSET`], so every pass and fast path of those ops
//! applies to them (the compiler's attention pass, LayerNormalization's row kernel, Gelu's
//! fused epilogue, the GEMM with packed weights).
//!
//! Three pieces have no standard spelling and are nodes of kiln's own domain [`KILN_DOMAIN`]:
//! `AttentionMask` (the mask formats of `Attention` / `MultiHeadAttention`, which depend on
//! the mask's rank, known at run time only), `RotaryEmbedding` with ONNX Runtime's
//! position-offset semantics, and `LSTM` whose state may be quantized (`DynamicQuantizeLSTM`). Attributes and inputs an expansion cannot honour (packed QKV,
//! a shared past buffer, rotary inside Attention, ...) are refused naming the attribute or
//! input; none is ignored.
//!
//! The expanded nodes are named `<node>/<what>` so profiles still point at the model's node.

use crate::attrs::{NodeCtx, Result};
use crate::proto::attribute_proto::AttributeType;
use crate::proto::tensor_proto::DataType;
use crate::proto::{AttributeProto, NodeProto, TensorProto};

/// The domain of kiln's own nodes written by expansions.
pub const KILN_DOMAIN: &str = "kiln.contrib";
/// The default-domain opset the expansions are written in and imported at.
pub const OPSET: i64 = 23;

const MS: &str = "com.microsoft";

/// Whether a node of `domain` / `op_type` is expanded here.
pub fn expands(domain: &str, op_type: &str) -> bool {
    match domain {
        MS => matches!(
            op_type,
            "Gelu"
                | "BiasGelu"
                | "FastGelu"
                | "QuickGelu"
                | "GemmFastGelu"
                | "SkipLayerNormalization"
                | "SkipSimplifiedLayerNormalization"
                | "SimplifiedLayerNormalization"
                | "EmbedLayerNormalization"
                | "Attention"
                | "MultiHeadAttention"
                | "RotaryEmbedding"
                | "FusedMatMul"
                | "FusedConv"
                | "FusedGemm"
                | "DynamicQuantizeMatMul"
                | "DynamicQuantizeLSTM"
                | "MatMulIntegerToFloat"
                | "QLinearAdd"
                | "QLinearMul"
                | "QLinearSigmoid"
                | "QLinearLeakyRelu"
                | "QLinearSoftmax"
                | "QLinearConcat"
                | "QLinearGlobalAveragePool"
                | "QLinearAveragePool"
                | "QGemm"
        ),
        // ONNX Runtime registers its RMS norm in the default domain.
        "" => op_type == "SimplifiedLayerNormalization",
        _ => false,
    }
}

/// The standard-op nodes computing `np` (see [`expands`]).
pub fn expand(ctx: &NodeCtx<'_>, np: &NodeProto) -> Result<Vec<NodeProto>> {
    let mut e = Emit {
        ctx,
        ins: &np.input,
        outs: &np.output,
        nodes: Vec::new(),
        tmp: 0,
    };
    match ctx.op_type {
        "Gelu" => {
            let x = e.need(0, "X")?;
            e.last("Gelu", &[&x], vec![])?;
        }
        "BiasGelu" => {
            let (a, b) = (e.need(0, "A")?, e.need(1, "B")?);
            let t = e.one("Add", &[&a, &b], vec![]);
            e.last("Gelu", &[&t], vec![])?;
        }
        "FastGelu" => {
            let mut x = e.need(0, "X")?;
            if let Some(b) = e.input(1) {
                x = e.one("Add", &[&x, &b], vec![]);
            }
            e.last("Gelu", &[&x], vec![attr_s("approximate", "tanh")])?;
        }
        "GemmFastGelu" => {
            let (x, w) = (e.need(0, "X")?, e.need(1, "W")?);
            let mut y = e.one("MatMul", &[&x, &w], vec![]);
            if let Some(b) = e.input(2) {
                y = e.one("Add", &[&y, &b], vec![]);
            }
            e.last("Gelu", &[&y], vec![attr_s("approximate", "tanh")])?;
        }
        "QuickGelu" => {
            let x = e.need(0, "X")?;
            let alpha = ctx.attr_f32_or("alpha", 1.702)?;
            // alpha 1 is SiLU (ONNX Runtime's fusion of EfficientNet's Mul(x, Sigmoid(x))):
            // spelled as that pair, the activation fusion puts it back into its producer.
            let t = if alpha == 1.0 {
                x.clone()
            } else {
                let a = e.scalar_like(alpha, &x);
                e.one("Mul", &[&x, &a], vec![])
            };
            let s = e.one("Sigmoid", &[&t], vec![]);
            e.last("Mul", &[&x, &s], vec![])?;
        }
        "SkipLayerNormalization" | "SkipSimplifiedLayerNormalization" => skip_norm(&mut e)?,
        "SimplifiedLayerNormalization" => {
            let (x, g) = (e.need(0, "X")?, e.need(1, "scale")?);
            e.refuse_outputs(1, "inv_std_var")?;
            let attrs = vec![
                attr_i("axis", ctx.attr_i64_or("axis", -1)?),
                attr_f("epsilon", ctx.attr_f32_or("epsilon", 1e-5)?),
                attr_i("stash_type", ctx.attr_i64_or("stash_type", 1)?),
            ];
            e.last("RMSNormalization", &[&x, &g], attrs)?;
        }
        "EmbedLayerNormalization" => embed_norm(&mut e)?,
        "Attention" => attention(&mut e)?,
        "MultiHeadAttention" => multi_head_attention(&mut e)?,
        "RotaryEmbedding" => {
            let (x, pos, cos, sin) = (
                e.need(0, "input")?,
                e.need(1, "position_ids")?,
                e.need(2, "cos_cache")?,
                e.need(3, "sin_cache")?,
            );
            if ctx.attr_f32_or("scale", 1.0)? != 1.0 {
                return Err(ctx.attr_err("scale", "only 1.0 is supported"));
            }
            if ctx.attr_i64_or("is_packed_batching", 0)? != 0 {
                return Err(ctx.attr_err("is_packed_batching", "packed batching is not supported"));
            }
            let attrs = vec![
                attr_i("interleaved", ctx.attr_i64_or("interleaved", 0)?),
                attr_i("num_heads", ctx.attr_i64_or("num_heads", 0)?),
                attr_i("rotary_embedding_dim", ctx.attr_i64_or("rotary_embedding_dim", 0)?),
            ];
            let y = e.out(0)?;
            e.emit(KILN_DOMAIN, "RotaryEmbedding", &[&x, &cos, &sin, &pos], &[&y], attrs);
        }
        "FusedMatMul" => fused_matmul(&mut e)?,
        "FusedConv" => fused_conv(&mut e, np)?,
        "FusedGemm" => fused_gemm(&mut e, np)?,
        "DynamicQuantizeMatMul" => {
            // A quantised per call (u8, as DynamicQuantizeLinear does), then as below.
            let (a, b, b_scale) = (e.need(0, "A")?, e.need(1, "B")?, e.need(2, "b_scale")?);
            let (aq, a_scale, a_zp) = (e.tmp("a_q"), e.tmp("a_scale"), e.tmp("a_zero_point"));
            e.emit("", "DynamicQuantizeLinear", &[&a], &[&aq, &a_scale, &a_zp], vec![]);
            let b_zp = e.input(3);
            let bias = e.input(4);
            integer_to_float(&mut e, &aq, &b, &a_scale, &b_scale, Some(a_zp), b_zp, bias)?;
        }
        "DynamicQuantizeLSTM" => dynamic_quantize_lstm(&mut e, np)?,
        "MatMulIntegerToFloat" => {
            let (a, b) = (e.need(0, "A")?, e.need(1, "B")?);
            let (a_scale, b_scale) = (e.need(2, "a_scale")?, e.need(3, "b_scale")?);
            let (a_zp, b_zp, bias) = (e.input(4), e.input(5), e.input(6));
            integer_to_float(&mut e, &a, &b, &a_scale, &b_scale, a_zp, b_zp, bias)?;
        }
        "QLinearAdd" | "QLinearMul" => {
            // A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point.
            let a = dequantize(&mut e, 0, "A")?;
            let b = dequantize(&mut e, 3, "B")?;
            let op = if ctx.op_type == "QLinearAdd" { "Add" } else { "Mul" };
            let y = e.one(op, &[&a, &b], vec![]);
            quantize_out(&mut e, &y, 6)?;
        }
        "QLinearSigmoid" | "QLinearLeakyRelu" => {
            // X, X_scale, X_zero_point, Y_scale, Y_zero_point.
            let x = dequantize(&mut e, 0, "X")?;
            let y = if ctx.op_type == "QLinearSigmoid" {
                e.one("Sigmoid", &[&x], vec![])
            } else {
                let alpha = ctx.attr_f32_or("alpha", 0.01)?;
                e.one("LeakyRelu", &[&x], vec![attr_f("alpha", alpha)])
            };
            quantize_out(&mut e, &y, 3)?;
        }
        "QLinearSoftmax" => {
            let x = dequantize(&mut e, 0, "X")?;
            let axis = ctx.attr_i64_or("axis", -1)?;
            let opset = ctx.attr_i64_or("opset", 13)?;
            // Before opset 13 Softmax flattened the dims from `axis` on: the same as 13's
            // per-axis softmax only when `axis` is the last one.
            if opset < 13 && axis != -1 {
                return Err(ctx.attr_err(
                    "axis",
                    format!("opset {opset} softmax over the dims from axis {axis} on is not supported (only axis -1)"),
                ));
            }
            let y = e.one("Softmax", &[&x], vec![attr_i("axis", axis)]);
            quantize_out(&mut e, &y, 3)?;
        }
        "QLinearConcat" => {
            // Y_scale, Y_zero_point, then (X, X_scale, X_zero_point) per input.
            let (ys, yz) = (e.need(0, "Y_scale")?, e.input(1));
            let n = e.ins.len().saturating_sub(2);
            if n == 0 || n % 3 != 0 {
                return Err(ctx.node_err(format!(
                    "expected Y_scale, Y_zero_point and triples of (X, X_scale, X_zero_point), got {} inputs",
                    e.ins.len()
                )));
            }
            let mut xs = Vec::new();
            for t in 0..n / 3 {
                xs.push(dequantize(&mut e, 2 + 3 * t, "X")?);
            }
            let refs: Vec<&str> = xs.iter().map(String::as_str).collect();
            let axis = ctx.attr_i64_or("axis", 0)?;
            let y = e.one("Concat", &refs, vec![attr_i("axis", axis)]);
            let mut inputs = vec![y.as_str(), ys.as_str()];
            if let Some(z) = yz.as_deref() {
                inputs.push(z);
            }
            e.last("QuantizeLinear", &inputs, vec![])?;
        }
        "QLinearGlobalAveragePool" | "QLinearAveragePool" => {
            if ctx.attr_i64_or("channels_last", 0)? != 0 {
                return Err(ctx.attr_err("channels_last", "only 0 (NCHW input) is supported"));
            }
            let x = dequantize(&mut e, 0, "X")?;
            let y = if ctx.op_type == "QLinearGlobalAveragePool" {
                e.one("GlobalAveragePool", &[&x], vec![])
            } else {
                let attrs: Vec<AttributeProto> = np
                    .attribute
                    .iter()
                    .filter(|a| a.name.as_deref() != Some("channels_last"))
                    .cloned()
                    .collect();
                e.one("AveragePool", &[&x], attrs)
            };
            quantize_out(&mut e, &y, 3)?;
        }
        "QGemm" => qgemm(&mut e)?,
        other => return Err(ctx.node_err(format!("no expansion for {other}"))),
    }
    Ok(e.nodes)
}

/// `DynamicQuantizeLSTM`: an LSTM whose W `[D, input, 4H]` and R `[D, H, 4H]` are 8-bit with
/// a scale and zero point per direction (`[D]`) or per direction and gate column (`[D, 4H]`),
/// inputs 8-11. The weights are dequantized (`(q - zero_point) * scale`, as
/// `DequantizeLinear`) and transposed to the standard LSTM's `[D, 4H, input]`; being constants,
/// the compiler folds that and packs them for the recurrent kernel. ONNX Runtime also
/// quantizes X and H to 8 bits on the fly at each step; here X stays float and H is
/// quantized to 16 bits for the recurrent product (`Recurrent::quantized_state`, exact
/// integer sums by the weights' int8 codes): closer to the float model than ONNX Runtime,
/// not bit-equal to it.
fn dynamic_quantize_lstm(e: &mut Emit<'_>, np: &NodeProto) -> Result<()> {
    let x = e.need(0, "X")?;
    let mut weights = Vec::new();
    for (slot, what) in [(1, "W"), (2, "R")] {
        let q = e.need(slot, what)?;
        let scale_slot = if slot == 1 { 8 } else { 10 };
        let scale = e.need(scale_slot, &format!("{what}_scale"))?;
        let zero = e.need(scale_slot + 1, &format!("{what}_zero_point"))?;
        // [D] or [D, 4H] as [D, 1, 1] or [D, 1, 4H]: along W's directions and gate columns.
        let shape = e.i64s(&[0, 1, -1]);
        let qf = e.one("Cast", &[&q], vec![attr_i("to", DataType::Float as i64)]);
        let zf = e.one("Cast", &[&zero], vec![attr_i("to", DataType::Float as i64)]);
        let zf = e.one("Reshape", &[&zf, &shape], vec![]);
        let sf = e.one("Reshape", &[&scale, &shape], vec![]);
        let centred = e.one("Sub", &[&qf, &zf], vec![]);
        let real = e.one("Mul", &[&centred, &sf], vec![]);
        weights.push(e.one("Transpose", &[&real], vec![attr_ints("perm", &[0, 2, 1])]));
    }
    // X, W, R, then B, sequence_lens, initial_h, initial_c, P as given (empty names kept).
    let opt = |i: usize| e.input(i).unwrap_or_default();
    let (b, lens, h0, c0, p) = (opt(3), opt(4), opt(5), opt(6), opt(7));
    let mut inputs = vec![
        x.as_str(),
        weights[0].as_str(),
        weights[1].as_str(),
        &b,
        &lens,
        &h0,
        &c0,
        &p,
    ];
    while inputs.last().is_some_and(|s| s.is_empty()) {
        inputs.pop();
    }
    let outs: Vec<String> = (0..3).map(|i| e.output(i).unwrap_or_default()).collect();
    let mut outs: Vec<&str> = outs.iter().map(String::as_str).collect();
    while outs.last().is_some_and(|s| s.is_empty()) {
        outs.pop();
    }
    // The LSTM attributes (direction, hidden_size, activations, clip, input_forget) as given,
    // in kiln's domain: an LSTM whose recurrent product may quantize its state, as this op's
    // definition does (to 16 bits here, where ONNX Runtime takes 8).
    e.emit(KILN_DOMAIN, "LSTM", &inputs, &outs, np.attribute.clone());
    Ok(())
}

/// `DequantizeLinear` of input `i` with its scale (`i + 1`) and zero point (`i + 2`, optional).
fn dequantize(e: &mut Emit<'_>, i: usize, what: &str) -> Result<String> {
    let x = e.need(i, what)?;
    let s = e.need(i + 1, &format!("{what}_scale"))?;
    match e.input(i + 2) {
        Some(z) => Ok(e.one("DequantizeLinear", &[&x, &s, &z], vec![])),
        None => Ok(e.one("DequantizeLinear", &[&x, &s], vec![])),
    }
}

/// The expansion's output 0: `QuantizeLinear(y)` by the scale in input `i` and the zero point
/// in `i + 1` (optional: u8, as ONNX Runtime's QLinear ops default to).
fn quantize_out(e: &mut Emit<'_>, y: &str, i: usize) -> Result<()> {
    let s = e.need(i, "Y_scale")?;
    match e.input(i + 1) {
        Some(z) => e.last("QuantizeLinear", &[y, &s, &z], vec![]),
        None => e.last("QuantizeLinear", &[y, &s], vec![]),
    }
}

/// `QGemm`: `alpha A' B' + C` of dequantized A and B (B's scale and zero point one, or one per
/// output column) and the int32 bias C dequantized by `a_scale * b_scale`, quantized by
/// `y_scale` / `y_zero_point` when given, else float. `alpha` other than 1 is refused (whether
/// it scales C is not pinned down).
fn qgemm(e: &mut Emit<'_>) -> Result<()> {
    let ctx = e.ctx;
    if ctx.attr_f32_or("alpha", 1.0)? != 1.0 {
        return Err(ctx.attr_err("alpha", "only 1.0 is supported"));
    }
    let trans_a = ctx.attr_i64_or("transA", 0)?;
    let trans_b = ctx.attr_i64_or("transB", 0)?;
    let a = dequantize(e, 0, "A")?;
    // B's per-column parameters run along its output axis: 1, or 0 when transposed.
    let (bq, bs) = (e.need(3, "B")?, e.need(4, "b_scale")?);
    let axis = attr_i("axis", if trans_b != 0 { 0 } else { 1 });
    let b = match e.input(5) {
        Some(z) => e.one("DequantizeLinear", &[&bq, &bs, &z], vec![axis]),
        None => e.one("DequantizeLinear", &[&bq, &bs], vec![axis]),
    };
    let attrs = vec![attr_i("transA", trans_a), attr_i("transB", trans_b)];
    let c = match e.input(6) {
        Some(c) => {
            let a_scale = e.need(1, "a_scale")?;
            let cs = e.one("Mul", &[&a_scale, &bs], vec![]);
            // An int32 zero point: a C of any other type (ONNX Runtime refuses those models)
            // fails DequantizeLinear's type check, naming this node, instead of being read as
            // something it is not.
            let zero = e.constant(TensorProto {
                dims: vec![],
                data_type: Some(DataType::Int32 as i32),
                int32_data: vec![0],
                ..Default::default()
            });
            Some(e.one("DequantizeLinear", &[&c, &cs, &zero], vec![attr_i("axis", 0)]))
        }
        None => None,
    };
    let mut inputs = vec![a.as_str(), b.as_str()];
    if let Some(c) = c.as_deref() {
        inputs.push(c);
    }
    match e.input(7) {
        Some(_) => {
            let y = e.one("Gemm", &inputs, attrs);
            quantize_out(e, &y, 7)
        }
        None => e.last("Gemm", &inputs, attrs),
    }
}

/// `SkipLayerNormalization` / `SkipSimplifiedLayerNormalization`: `s = input + skip (+ bias)`
/// normalised over the last axis; output 3 is `s`.
fn skip_norm(e: &mut Emit<'_>) -> Result<()> {
    let ctx = e.ctx;
    let simplified = ctx.op_type == "SkipSimplifiedLayerNormalization";
    let (x, skip, gamma) = (e.need(0, "input")?, e.need(1, "skip")?, e.need(2, "gamma")?);
    let (beta, bias) = if simplified {
        (None, e.input(3))
    } else {
        (e.input(3), e.input(4))
    };
    let eps = ctx.attr_f32_or("epsilon", 1e-12)?;
    let sum_out = e.output(3);
    let s = match bias {
        None => e.named("Add", &[&x, &skip], sum_out.as_deref(), vec![]),
        Some(b) => {
            let t = e.one("Add", &[&x, &skip], vec![]);
            e.named("Add", &[&t, &b], sum_out.as_deref(), vec![])
        }
    };
    let y = e.out(0)?;
    if simplified {
        e.refuse_outputs(1, "mean")?;
        e.refuse_outputs(2, "inv_std_var")?;
        e.emit(
            "",
            "RMSNormalization",
            &[&s, &gamma],
            &[&y],
            vec![attr_i("axis", -1), attr_f("epsilon", eps)],
        );
    } else {
        let mean = e.output(1).unwrap_or_default();
        let inv = e.output(2).unwrap_or_default();
        let beta = beta.unwrap_or_default();
        e.emit(
            "",
            "LayerNormalization",
            &[&s, &gamma, &beta],
            &[&y, &mean, &inv],
            vec![attr_i("axis", -1), attr_f("epsilon", eps)],
        );
    }
    Ok(())
}

/// `EmbedLayerNormalization`: word + position (+ segment) embeddings, layer-normalised; the
/// mask index is the row sums of the mask (zeros without one); output 2 is the sum.
fn embed_norm(e: &mut Emit<'_>) -> Result<()> {
    let ctx = e.ctx;
    let ids = e.need(0, "input_ids")?;
    let (we, pe) = (e.need(2, "word_embedding")?, e.need(3, "position_embedding")?);
    let (gamma, beta) = (e.need(5, "gamma")?, e.need(6, "beta")?);
    let eps = ctx.attr_f32_or("epsilon", 1e-12)?;
    let words = e.one("Gather", &[&we, &ids], vec![]);
    let positions = match e.input(8) {
        Some(pos) => e.one("Gather", &[&pe, &pos], vec![]),
        None => {
            let zero = e.i64s(&[0]);
            let len = e.one("Shape", &[&ids], vec![attr_i("start", 1), attr_i("end", 2)]);
            e.one("Slice", &[&pe, &zero, &len, &zero], vec![])
        }
    };
    let mut sum = e.one("Add", &[&words, &positions], vec![]);
    if let (Some(seg), Some(se)) = (e.input(1), e.input(4)) {
        let segs = e.one("Gather", &[&se, &seg], vec![]);
        sum = e.one("Add", &[&sum, &segs], vec![]);
    }
    if let Some(name) = e.output(2) {
        e.emit("", "Identity", &[&sum], &[&name], vec![]);
    }
    let y = e.out(0)?;
    e.emit(
        "",
        "LayerNormalization",
        &[&sum, &gamma, &beta],
        &[&y],
        vec![attr_i("axis", -1), attr_f("epsilon", eps)],
    );
    if let Some(mi) = e.output(1) {
        if ctx.attr_i64_or("mask_index_type", 1)? != 1 {
            return Err(ctx.attr_err("mask_index_type", "mask_index is written only for type 1"));
        }
        match e.input(7) {
            Some(mask) => {
                let m = e.one("Cast", &[&mask], vec![attr_i("to", DataType::Int32 as i64)]);
                let axes = e.i64s(&[1]);
                e.emit("", "ReduceSum", &[&m, &axes], &[&mi], vec![attr_i("keepdims", 0)]);
            }
            None => {
                let batch = e.one("Shape", &[&ids], vec![attr_i("start", 0), attr_i("end", 1)]);
                let zero = TensorProto {
                    dims: vec![1],
                    data_type: Some(DataType::Int32 as i32),
                    int32_data: vec![0],
                    ..Default::default()
                };
                e.emit("", "ConstantOfShape", &[&batch], &[&mi], vec![attr_t("value", zero)]);
            }
        }
    }
    Ok(())
}

/// The attributes both attention ops share.
struct AttentionAttrs {
    heads: i64,
    causal: bool,
    filter: f32,
    scale: Option<f32>,
}

fn attention_attrs(ctx: &NodeCtx<'_>) -> Result<AttentionAttrs> {
    let heads = ctx.attr_i64_or("num_heads", 0)?;
    if heads <= 0 {
        return Err(ctx.attr_err("num_heads", format!("expected a positive head count, got {heads}")));
    }
    let scale = ctx.attr_f32_or("scale", 0.0)?;
    Ok(AttentionAttrs {
        heads,
        causal: ctx.attr_bool_or("unidirectional", false)?,
        filter: ctx.attr_f32_or("mask_filter_value", -10000.0)?,
        scale: (scale != 0.0).then_some(scale),
    })
}

/// The scores' additive mask (`AttentionMask`, plus `attention_bias`), if any.
fn score_bias(
    e: &mut Emit<'_>,
    a: &AttentionAttrs,
    mask: Option<String>,
    bias: Option<String>,
    q: &str,
    k: &str,
    past_key: Option<&str>,
) -> Option<String> {
    let m = (mask.is_some() || a.causal).then(|| {
        let out = e.tmp("mask");
        e.emit(
            KILN_DOMAIN,
            "AttentionMask",
            &[mask.as_deref().unwrap_or(""), q, k, past_key.unwrap_or("")],
            &[&out],
            vec![
                attr_f("mask_filter_value", a.filter),
                attr_i("unidirectional", i64::from(a.causal)),
            ],
        );
        out
    });
    match (m, bias) {
        (Some(m), Some(b)) => Some(e.one("Add", &[&m, &b], vec![])),
        (m, b) => m.or(b),
    }
}

fn onnx_attention_attrs(a: &AttentionAttrs) -> Vec<AttributeProto> {
    let mut attrs = vec![attr_i("q_num_heads", a.heads), attr_i("kv_num_heads", a.heads)];
    if let Some(s) = a.scale {
        attrs.push(attr_f("scale", s));
    }
    attrs
}

/// com.microsoft `Attention`: one QKV projection of the input, split, then ONNX `Attention`;
/// `past` / `present` are the stacked `[2, B, N, P, D]` caches.
fn attention(e: &mut Emit<'_>) -> Result<()> {
    let ctx = e.ctx;
    let a = attention_attrs(ctx)?;
    if ctx.attr_i64_or("do_rotary", 0)? != 0 {
        return Err(ctx.attr_err("do_rotary", "rotary embedding inside Attention is not supported"));
    }
    if ctx.attr_i64_or("past_present_share_buffer", 0)? != 0 {
        return Err(ctx.attr_err(
            "past_present_share_buffer",
            "a shared past/present buffer is not supported",
        ));
    }
    e.refuse_input(6, "past_sequence_length")?;
    let (x, w) = (e.need(0, "input")?, e.need(1, "weights")?);
    let mut qkv = e.one("MatMul", &[&x, &w], vec![]);
    if let Some(b) = e.input(2) {
        qkv = e.one("Add", &[&qkv, &b], vec![]);
    }
    let (q, k, v) = (e.tmp("q"), e.tmp("k"), e.tmp("v"));
    match ctx.attr_i64s("qkv_hidden_sizes")? {
        Some(sizes) => {
            if sizes.len() != 3 || sizes.iter().any(|&s| s <= 0) {
                return Err(ctx.attr_err(
                    "qkv_hidden_sizes",
                    format!("expected three positive sizes, got {sizes:?}"),
                ));
            }
            let split = e.i64s(&sizes);
            e.emit("", "Split", &[&qkv, &split], &[&q, &k, &v], vec![attr_i("axis", -1)]);
        }
        None => e.emit(
            "",
            "Split",
            &[&qkv],
            &[&q, &k, &v],
            vec![attr_i("axis", -1), attr_i("num_outputs", 3)],
        ),
    }
    let past = e.input(4).map(|p| {
        let (i0, i1) = (e.i64_tensor(&[], &[0]), e.i64_tensor(&[], &[1]));
        let pk = e.one("Gather", &[&p, &i0], vec![attr_i("axis", 0)]);
        let pv = e.one("Gather", &[&p, &i1], vec![attr_i("axis", 0)]);
        (pk, pv)
    });
    let mask = e.input(3);
    let bias = e.input(5);
    let m = score_bias(e, &a, mask, bias, &q, &k, past.as_ref().map(|p| p.0.as_str()));
    let y = e.out(0)?;
    let present = e.output(1);
    let (pko, pvo) = if present.is_some() {
        (e.tmp("present_key"), e.tmp("present_value"))
    } else {
        (String::new(), String::new())
    };
    let (pk, pv) = past.unwrap_or_default();
    e.emit(
        "",
        "Attention",
        &[&q, &k, &v, m.as_deref().unwrap_or(""), &pk, &pv],
        &[&y, &pko, &pvo],
        onnx_attention_attrs(&a),
    );
    if let Some(present) = present {
        let zero = e.i64s(&[0]);
        let k4 = e.one("Unsqueeze", &[&pko, &zero], vec![]);
        let v4 = e.one("Unsqueeze", &[&pvo, &zero], vec![]);
        e.emit("", "Concat", &[&k4, &v4], &[&present], vec![attr_i("axis", 0)]);
    }
    Ok(())
}

/// com.microsoft `MultiHeadAttention` on separate 3-D Q, K, V (with an optional packed bias)
/// and `[B, N, P, D]` caches.
fn multi_head_attention(e: &mut Emit<'_>) -> Result<()> {
    let ctx = e.ctx;
    let a = attention_attrs(ctx)?;
    let mut q = e.need(0, "query")?;
    let Some(mut k) = e.input(1) else {
        return Err(ctx.node_err("packed QKV in the query (no key input) is not supported"));
    };
    let Some(mut v) = e.input(2) else {
        return Err(ctx.node_err("packed KV in the key (no value input) is not supported"));
    };
    e.refuse_input(8, "past_sequence_length")?;
    e.refuse_input(9, "cache_indirection")?;
    e.refuse_outputs(3, "qk")?;
    if let Some(bias) = e.input(3) {
        // [D | D | Dv]: Q's and K's parts are the query's width each.
        let width = e.one("Shape", &[&q], vec![attr_i("start", -1)]);
        let twice = e.one("Add", &[&width, &width], vec![]);
        let (zero, end, axis) = (e.i64s(&[0]), e.i64s(&[i64::MAX]), e.i64s(&[0]));
        let bq = e.one("Slice", &[&bias, &zero, &width, &axis], vec![]);
        let bk = e.one("Slice", &[&bias, &width, &twice, &axis], vec![]);
        let bv = e.one("Slice", &[&bias, &twice, &end, &axis], vec![]);
        q = e.one("Add", &[&q, &bq], vec![]);
        k = e.one("Add", &[&k, &bk], vec![]);
        v = e.one("Add", &[&v, &bv], vec![]);
    }
    let (pk, pv) = (e.input(6), e.input(7));
    if pk.is_some() != pv.is_some() {
        return Err(ctx.node_err("past_key and past_value must be given together"));
    }
    let mask = e.input(4);
    let bias = e.input(5);
    let m = score_bias(e, &a, mask, bias, &q, &k, pk.as_deref());
    let y = e.out(0)?;
    let (pko, pvo) = (e.output(1).unwrap_or_default(), e.output(2).unwrap_or_default());
    e.emit(
        "",
        "Attention",
        &[
            &q,
            &k,
            &v,
            m.as_deref().unwrap_or(""),
            pk.as_deref().unwrap_or(""),
            pv.as_deref().unwrap_or(""),
        ],
        &[&y, &pko, &pvo],
        onnx_attention_attrs(&a),
    );
    Ok(())
}

/// `FusedMatMul`: `alpha * op(A) op(B)` with `op` an optional swap of the last two axes.
fn fused_matmul(e: &mut Emit<'_>) -> Result<()> {
    let ctx = e.ctx;
    let (a, b) = (e.need(0, "A")?, e.need(1, "B")?);
    for attr in ["transBatchA", "transBatchB"] {
        if ctx.attr_i64_or(attr, 0)? != 0 {
            return Err(ctx.attr_err(attr, "batch transposes are not supported"));
        }
    }
    let (ta, tb) = (ctx.attr_bool_or("transA", false)?, ctx.attr_bool_or("transB", false)?);
    let alpha = ctx.attr_f32_or("alpha", 1.0)?;
    let product = if ta || tb {
        let eq = format!(
            "...{},...{}->...ik",
            if ta { "ji" } else { "ij" },
            if tb { "kj" } else { "jk" }
        );
        ("Einsum", vec![attr_s("equation", &eq)])
    } else {
        ("MatMul", vec![])
    };
    if alpha == 1.0 {
        e.last(product.0, &[&a, &b], product.1)?;
    } else {
        let y = e.one(product.0, &[&a, &b], product.1);
        let s = e.scalar_like(alpha, &y);
        e.last("Mul", &[&y, &s], vec![])?;
    }
    Ok(())
}

/// `FusedConv`: `Conv`, plus `Z` when given, then the activation.
fn fused_conv(e: &mut Emit<'_>, np: &NodeProto) -> Result<()> {
    let ctx = e.ctx;
    let (x, w) = (e.need(0, "X")?, e.need(1, "W")?);
    let conv_attrs: Vec<AttributeProto> = np
        .attribute
        .iter()
        .filter(|a| !matches!(a.name.as_deref(), Some("activation" | "activation_params")))
        .cloned()
        .collect();
    let b = e.input(2).unwrap_or_default();
    let mut y = e.one("Conv", &[&x, &w, &b], conv_attrs);
    if let Some(z) = e.input(3) {
        y = e.one("Add", &[&y, &z], vec![]);
    }
    let act = ctx.attr_string_or("activation", "")?;
    let params = ctx.attr_f32s("activation_params")?.unwrap_or_default();
    let param = |i: usize, what: &str| {
        params.get(i).copied().ok_or_else(|| {
            ctx.attr_err(
                "activation_params",
                format!("{act} needs {what} at position {i}, got {params:?}"),
            )
        })
    };
    match act.as_str() {
        "" | "Identity" => e.last("Identity", &[&y], vec![])?,
        "Relu" | "Sigmoid" | "Tanh" => e.last(&act, &[&y], vec![])?,
        "LeakyRelu" => e.last("LeakyRelu", &[&y], vec![attr_f("alpha", param(0, "alpha")?)])?,
        "HardSigmoid" => e.last(
            "HardSigmoid",
            &[&y],
            vec![attr_f("alpha", param(0, "alpha")?), attr_f("beta", param(1, "beta")?)],
        )?,
        "Clip" => {
            let lo = e.scalar_like(param(0, "min")?, &y);
            let hi = e.scalar_like(param(1, "max")?, &y);
            e.last("Clip", &[&y, &lo, &hi], vec![])?;
        }
        other => {
            return Err(ctx.attr_err("activation", format!("unknown activation {other:?}")));
        }
    }
    Ok(())
}

/// `(A - a_zp)(B - b_zp) * (a_scale * b_scale) + bias`, the integer product exact in i32 and
/// scaled once in float, as ONNX Runtime does.
#[allow(clippy::too_many_arguments)]
fn integer_to_float(
    e: &mut Emit<'_>,
    a: &str,
    b: &str,
    a_scale: &str,
    b_scale: &str,
    a_zp: Option<String>,
    b_zp: Option<String>,
    bias: Option<String>,
) -> Result<()> {
    let acc = e.one(
        "MatMulInteger",
        &[a, b, a_zp.as_deref().unwrap_or(""), b_zp.as_deref().unwrap_or("")],
        vec![],
    );
    let accf = e.one("CastLike", &[&acc, a_scale], vec![]);
    let scale = e.one("Mul", &[a_scale, b_scale], vec![]);
    match bias {
        None => e.last("Mul", &[&accf, &scale], vec![]),
        Some(bias) => {
            let y = e.one("Mul", &[&accf, &scale], vec![]);
            e.last("Add", &[&y, &bias], vec![])
        }
    }
}

/// `FusedGemm`: `Gemm`, then the activation (`activation_alpha` / `_beta` its parameters).
fn fused_gemm(e: &mut Emit<'_>, np: &NodeProto) -> Result<()> {
    let ctx = e.ctx;
    let (a, b) = (e.need(0, "A")?, e.need(1, "B")?);
    let c = e.input(2).unwrap_or_default();
    let gemm_attrs: Vec<AttributeProto> = np
        .attribute
        .iter()
        .filter(|a| !a.name.as_deref().is_some_and(|n| n.starts_with("activation")))
        .cloned()
        .collect();
    let y = e.one("Gemm", &[&a, &b, &c], gemm_attrs);
    let act = ctx.attr_string_or("activation", "")?;
    let alpha = ctx.attr_f32("activation_alpha")?;
    let beta = ctx.attr_f32("activation_beta")?;
    let mut attrs = Vec::new();
    match act.as_str() {
        "" | "Identity" => return e.last("Identity", &[&y], vec![]),
        "Relu" | "Sigmoid" | "Tanh" => {}
        "LeakyRelu" | "Elu" | "Celu" => attrs.extend(alpha.map(|v| attr_f("alpha", v))),
        "HardSigmoid" | "ThresholdedRelu" | "Selu" => {
            let (an, bn) = if act == "Selu" {
                ("alpha", "gamma")
            } else {
                ("alpha", "beta")
            };
            attrs.extend(alpha.map(|v| attr_f(an, v)));
            attrs.extend(beta.map(|v| attr_f(bn, v)));
        }
        other => {
            return Err(ctx.attr_err("activation", format!("unknown activation {other:?}")));
        }
    }
    e.last(&act, &[&y], attrs)
}

/// Writes the nodes of one expansion.
struct Emit<'a> {
    ctx: &'a NodeCtx<'a>,
    ins: &'a [String],
    outs: &'a [String],
    nodes: Vec<NodeProto>,
    tmp: usize,
}

impl Emit<'_> {
    /// Input `i` when the node gives it.
    fn input(&self, i: usize) -> Option<String> {
        self.ins.get(i).filter(|n| !n.is_empty()).cloned()
    }

    fn need(&self, i: usize, what: &str) -> Result<String> {
        self.input(i)
            .ok_or_else(|| self.ctx.node_err(format!("input {i} ({what}) is required")))
    }

    fn refuse_input(&self, i: usize, what: &str) -> Result<()> {
        match self.input(i) {
            Some(_) => Err(self.ctx.node_err(format!("input {i} ({what}) is not supported"))),
            None => Ok(()),
        }
    }

    /// Output `i` when the node asks for it.
    fn output(&self, i: usize) -> Option<String> {
        self.outs.get(i).filter(|n| !n.is_empty()).cloned()
    }

    fn out(&self, i: usize) -> Result<String> {
        self.output(i)
            .ok_or_else(|| self.ctx.node_err(format!("output {i} is required")))
    }

    fn refuse_outputs(&self, i: usize, what: &str) -> Result<()> {
        match self.output(i) {
            Some(_) => Err(self.ctx.node_err(format!("output {i} ({what}) is not supported"))),
            None => Ok(()),
        }
    }

    fn tmp(&mut self, what: &str) -> String {
        self.tmp += 1;
        format!("{}/{what}#{}", self.ctx.name, self.tmp)
    }

    fn emit(&mut self, domain: &str, op: &str, inputs: &[&str], outputs: &[&str], attribute: Vec<AttributeProto>) {
        let name = format!("{}/{op}#{}", self.ctx.name, self.nodes.len());
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            name: Some(name),
            op_type: Some(op.to_string()),
            domain: Some(domain.to_string()),
            attribute,
            ..Default::default()
        });
    }

    /// A default-domain node with one new output; returns its name.
    fn one(&mut self, op: &str, inputs: &[&str], attrs: Vec<AttributeProto>) -> String {
        self.named(op, inputs, None, attrs)
    }

    /// Like [`Self::one`], writing `name` when given.
    fn named(&mut self, op: &str, inputs: &[&str], name: Option<&str>, attrs: Vec<AttributeProto>) -> String {
        let out = name.map_or_else(|| self.tmp(op), str::to_string);
        self.emit("", op, inputs, &[&out], attrs);
        out
    }

    /// The node writing the expansion's output 0.
    fn last(&mut self, op: &str, inputs: &[&str], attrs: Vec<AttributeProto>) -> Result<()> {
        let y = self.out(0)?;
        self.emit("", op, inputs, &[&y], attrs);
        Ok(())
    }

    fn constant(&mut self, t: TensorProto) -> String {
        let out = self.tmp("const");
        self.emit("", "Constant", &[], &[&out], vec![attr_t("value", t)]);
        out
    }

    /// An int64 constant of shape `dims` (`[]`: a scalar).
    fn i64_tensor(&mut self, dims: &[i64], v: &[i64]) -> String {
        self.constant(TensorProto {
            dims: dims.to_vec(),
            data_type: Some(DataType::Int64 as i32),
            int64_data: v.to_vec(),
            ..Default::default()
        })
    }

    fn i64s(&mut self, v: &[i64]) -> String {
        self.i64_tensor(&[v.len() as i64], v)
    }

    /// A scalar of `like`'s type.
    fn scalar_like(&mut self, v: f32, like: &str) -> String {
        let c = self.constant(TensorProto {
            dims: vec![],
            data_type: Some(DataType::Float as i32),
            float_data: vec![v],
            ..Default::default()
        });
        self.one("CastLike", &[&c, like], vec![])
    }
}

fn attr(name: &str, kind: AttributeType) -> AttributeProto {
    AttributeProto {
        name: Some(name.to_string()),
        r#type: Some(kind as i32),
        ..Default::default()
    }
}

fn attr_i(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        i: Some(v),
        ..attr(name, AttributeType::Int)
    }
}

fn attr_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        ints: v.to_vec(),
        ..attr(name, AttributeType::Ints)
    }
}

fn attr_f(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        f: Some(v),
        ..attr(name, AttributeType::Float)
    }
}

fn attr_s(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        s: Some(v.as_bytes().to_vec().into()),
        ..attr(name, AttributeType::String)
    }
}

fn attr_t(name: &str, v: TensorProto) -> AttributeProto {
    AttributeProto {
        t: Some(v),
        ..attr(name, AttributeType::Tensor)
    }
}
