"""Write conformance cases for the com.microsoft ops kiln imports (the ones ONNX Runtime's
transformer optimiser and graph optimiser write), with ONNX Runtime's outputs as the reference.

Each case is a small model built with onnx.helper, in the backend-test layout kiln-conformance
reads: `<out>/contrib/<case>/model.onnx`, `test_data_set_0/{input,output}_K.pb`, `meta.json`.
Inputs are random (fixed seed) with the value ranges real models feed (0/1 masks, in-range ids).

usage: python scripts/make_contrib_tests.py OUT_DIR
"""
from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"
RNG = np.random.default_rng(7)
F = TensorProto.FLOAT


def randn(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def case(out, name, nodes, inputs, outputs, feeds, inits=(), opset=17, rtol=1e-4, atol=1e-5):
    """`inputs`/`outputs`: (name, elem_type, shape or None); `feeds`: name -> array."""
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        initializer=[numpy_helper.from_array(a, n) for n, a in inits],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    )
    model.ir_version = 8
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    got = sess.run(None, {n: feeds[n] for n, _, _ in inputs})
    d = os.path.join(out, name)
    ds = os.path.join(d, "test_data_set_0")
    os.makedirs(ds, exist_ok=True)
    onnx.save(model, os.path.join(d, "model.onnx"))
    for i, (n, _, _) in enumerate(inputs):
        with open(os.path.join(ds, f"input_{i}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(feeds[n], n).SerializeToString())
    for i, ((n, _, _), v) in enumerate(zip(outputs, got)):
        with open(os.path.join(ds, f"output_{i}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(np.asarray(v), n).SerializeToString())
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"rtol": rtol, "atol": atol}, f)


def activations(out):
    x = randn(2, 3, 8, scale=2.0)
    b = randn(8)
    case(out, "gelu", [helper.make_node("Gelu", ["x"], ["y"], domain=MS)],
         [("x", F, [2, 3, 8])], [("y", F, None)], {"x": x})
    case(out, "bias_gelu", [helper.make_node("BiasGelu", ["x", "b"], ["y"], domain=MS)],
         [("x", F, [2, 3, 8]), ("b", F, [8])], [("y", F, None)], {"x": x, "b": b})
    case(out, "fast_gelu_bias", [helper.make_node("FastGelu", ["x", "b"], ["y"], domain=MS)],
         [("x", F, [2, 3, 8]), ("b", F, [8])], [("y", F, None)], {"x": x, "b": b})
    case(out, "fast_gelu", [helper.make_node("FastGelu", ["x"], ["y"], domain=MS)],
         [("x", F, [2, 3, 8])], [("y", F, None)], {"x": x})
    case(out, "quick_gelu", [helper.make_node("QuickGelu", ["x"], ["y"], domain=MS)],
         [("x", F, [2, 3, 8])], [("y", F, None)], {"x": x})
    case(out, "quick_gelu_alpha", [helper.make_node("QuickGelu", ["x"], ["y"], domain=MS, alpha=1.25)],
         [("x", F, [2, 3, 8])], [("y", F, None)], {"x": x})
    # alpha 1 is SiLU, as ONNX Runtime's optimiser writes EfficientNet's: after a Conv, it
    # becomes the convolution's epilogue.
    xi, w, b = randn(1, 3, 9, 9), randn(8, 3, 3, 3, scale=0.5), randn(8)
    case(out, "conv_quick_gelu_silu",
         [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
          helper.make_node("QuickGelu", ["c"], ["y"], domain=MS, alpha=1.0)],
         [("x", F, [1, 3, 9, 9])], [("y", F, None)], {"x": xi}, inits=[("w", w), ("b", b)])


def norms(out):
    x, s = randn(2, 4, 16), randn(2, 4, 16)
    g, be, bi = randn(16), randn(16), randn(16)
    ins = [("x", F, [2, 4, 16]), ("s", F, [2, 4, 16]), ("g", F, [16]), ("be", F, [16]), ("bi", F, [16])]
    feeds = {"x": x, "s": s, "g": g, "be": be, "bi": bi}
    case(out, "skip_layer_norm",
         [helper.make_node("SkipLayerNormalization", ["x", "s", "g", "be", "bi"], ["y", "", "", "sum"],
                           domain=MS, epsilon=1e-5)],
         ins, [("y", F, None), ("sum", F, None)], feeds)
    case(out, "skip_layer_norm_no_beta",
         [helper.make_node("SkipLayerNormalization", ["x", "s", "g"], ["y"], domain=MS, epsilon=1e-12)],
         ins[:3], [("y", F, None)], feeds)
    case(out, "skip_layer_norm_skip_2d",
         [helper.make_node("SkipLayerNormalization", ["x", "s2", "g", "be"], ["y"], domain=MS, epsilon=1e-5)],
         [ins[0], ("s2", F, [4, 16]), ins[2], ins[3]], [("y", F, None)], {**feeds, "s2": randn(4, 16)})
    case(out, "skip_simplified_layer_norm",
         [helper.make_node("SkipSimplifiedLayerNormalization", ["x", "s", "g", "bi"], ["y", "", "", "sum"],
                           domain=MS, epsilon=1e-6)],
         [ins[0], ins[1], ins[2], ins[4]], [("y", F, None), ("sum", F, None)], feeds)
    case(out, "simplified_layer_norm",
         [helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["y"], epsilon=1e-6, axis=-1)],
         [ins[0], ins[2]], [("y", F, None)], feeds)
    # EmbedLayerNormalization: BERT's embeddings and its mask index.
    b, sq, h = 2, 5, 16
    ids = RNG.integers(0, 30, (b, sq)).astype(np.int32)
    seg = RNG.integers(0, 2, (b, sq)).astype(np.int32)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int32)
    inits = [("we", randn(30, h)), ("pe", randn(10, h)), ("se", randn(2, h)), ("g", randn(h)), ("be", randn(h))]
    case(out, "embed_layer_norm",
         [helper.make_node("EmbedLayerNormalization", ["ids", "seg", "we", "pe", "se", "g", "be", "mask"],
                           ["y", "mi", "esum"], domain=MS, epsilon=1e-12)],
         [("ids", TensorProto.INT32, [b, sq]), ("seg", TensorProto.INT32, [b, sq]),
          ("mask", TensorProto.INT32, [b, sq])],
         [("y", F, None), ("mi", TensorProto.INT32, None), ("esum", F, None)],
         {"ids": ids, "seg": seg, "mask": mask}, inits=inits)
    pos = np.array([[0, 1, 2, 3, 4], [2, 3, 4, 5, 6]], np.int32)
    case(out, "embed_layer_norm_positions",
         [helper.make_node("EmbedLayerNormalization", ["ids", "", "we", "pe", "", "g", "be", "", "pos"],
                           ["y", "mi"], domain=MS, epsilon=1e-5)],
         [("ids", TensorProto.INT32, [b, sq]), ("pos", TensorProto.INT32, [b, sq])],
         [("y", F, None), ("mi", TensorProto.INT32, None)], {"ids": ids, "pos": pos}, inits=inits)


def attention(out):
    b, sq, hid, heads = 2, 5, 16, 4
    x = randn(b, sq, hid)
    w, bias = randn(hid, 3 * hid, scale=0.3), randn(3 * hid, scale=0.3)
    inits = [("w", w), ("bias", bias)]
    raw = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int32)

    def att(name, extra_inputs, feeds, outputs=(("y", F, None),), node_inputs=None, **attrs):
        node_inputs = node_inputs or ["x", "w", "bias"] + [n for n, _, _ in extra_inputs]
        case(out, name,
             [helper.make_node("Attention", node_inputs, [n for n, _, _ in outputs], domain=MS,
                               num_heads=heads, **attrs)],
             [("x", F, [b, sq, hid])] + list(extra_inputs), list(outputs), {"x": x, **feeds}, inits=inits)

    att("attention", [], {})
    att("attention_mask_raw", [("m", TensorProto.INT32, [b, sq])], {"m": raw})
    att("attention_mask_1d", [("m", TensorProto.INT32, [b])], {"m": np.array([5, 3], np.int32)})
    att("attention_mask_3d", [("m", TensorProto.INT32, [b, sq, sq])],
        {"m": RNG.integers(0, 2, (b, sq, sq)).astype(np.int32) | np.eye(sq, dtype=np.int32)})
    att("attention_causal", [("m", TensorProto.INT32, [b, sq])], {"m": raw}, unidirectional=1)
    att("attention_scale_filter", [("m", TensorProto.INT32, [b, sq])], {"m": raw}, scale=0.2,
        mask_filter_value=-1000.0)
    att("attention_bias_input", [("m", TensorProto.INT32, [b, sq]), ("ab", F, [1, heads, sq, sq])],
        {"m": raw, "ab": randn(1, heads, sq, sq)}, node_inputs=["x", "w", "bias", "m", "", "ab"])
    # Unequal Q/K/V widths.
    w2, bias2 = randn(hid, 8 + 8 + 12, scale=0.3), randn(28, scale=0.3)
    case(out, "attention_qkv_sizes",
         [helper.make_node("Attention", ["x", "w2", "bias2"], ["y"], domain=MS, num_heads=heads,
                           qkv_hidden_sizes=[8, 8, 12])],
         [("x", F, [b, sq, hid])], [("y", F, None)], {"x": x}, inits=[("w2", w2), ("bias2", bias2)])
    # GPT-2 style: a causal step with a cache (past [2, B, N, P, D]) and its present.
    past = randn(2, b, heads, 3, hid // heads)
    att("attention_past", [("m", TensorProto.INT32, [b, 3 + sq]), ("past", F, [2, b, heads, 3, hid // heads])],
        {"m": np.ones((b, 3 + sq), np.int32), "past": past},
        outputs=(("y", F, None), ("present", F, None)), unidirectional=1)


def mha(out):
    b, sq, skv, hid, heads = 2, 4, 6, 16, 4
    q, k, v = randn(b, sq, hid), randn(b, skv, hid), randn(b, skv, hid)
    bias = randn(3 * hid, scale=0.3)
    kpm = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], np.int32)
    ins = [("q", F, [b, sq, hid]), ("k", F, [b, skv, hid]), ("v", F, [b, skv, hid])]
    feeds = {"q": q, "k": k, "v": v, "bias": bias, "kpm": kpm}
    case(out, "mha", [helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["y"], domain=MS, num_heads=heads)],
         ins, [("y", F, None)], feeds)
    case(out, "mha_bias_mask",
         [helper.make_node("MultiHeadAttention", ["q", "k", "v", "bias", "kpm"], ["y"], domain=MS,
                           num_heads=heads)],
         ins + [("bias", F, [3 * hid]), ("kpm", TensorProto.INT32, [b, skv])], [("y", F, None)], feeds)
    ab = randn(b, heads, sq, skv)
    case(out, "mha_attention_bias",
         [helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "", "ab"], ["y"], domain=MS,
                           num_heads=heads, scale=0.3)],
         ins + [("ab", F, [b, heads, sq, skv])], [("y", F, None)], {**feeds, "ab": ab})
    # Self-attention decoding step with a cache.
    p = 3
    pk, pv = randn(b, heads, p, hid // heads), randn(b, heads, p, hid // heads)
    ks, vs = randn(b, sq, hid), randn(b, sq, hid)
    case(out, "mha_past",
         [helper.make_node("MultiHeadAttention", ["q", "ks", "vs", "", "", "", "pk", "pv"], ["y", "pko", "pvo"],
                           domain=MS, num_heads=heads, unidirectional=1)],
         [ins[0], ("ks", F, [b, sq, hid]), ("vs", F, [b, sq, hid]),
          ("pk", F, [b, heads, p, hid // heads]), ("pv", F, [b, heads, p, hid // heads])],
         [("y", F, None), ("pko", F, None), ("pvo", F, None)],
         {"q": q, "ks": ks, "vs": vs, "pk": pk, "pv": pv})


def rotary(out):
    b, sq, heads, d = 2, 5, 2, 8
    x = randn(b, sq, heads * d)
    cos_t = np.cos(np.outer(np.arange(16), 1.0 / 10000 ** (np.arange(0, d, 2) / d))).astype(np.float32)
    sin_t = np.sin(np.outer(np.arange(16), 1.0 / 10000 ** (np.arange(0, d, 2) / d))).astype(np.float32)
    pos = np.array([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]], np.int64)
    inits = [("cos", cos_t), ("sin", sin_t)]
    for inter in (0, 1):
        case(out, f"rotary_interleaved{inter}",
             [helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS,
                               interleaved=inter, num_heads=heads)],
             [("x", F, [b, sq, heads * d]), ("pos", TensorProto.INT64, [b, sq])], [("y", F, None)],
             {"x": x, "pos": pos}, inits=inits)
    case(out, "rotary_offset",
         [helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS, num_heads=heads)],
         [("x", F, [b, sq, heads * d]), ("pos", TensorProto.INT64, [1])], [("y", F, None)],
         {"x": x, "pos": np.array([4], np.int64)}, inits=inits)
    x4 = randn(b, heads, sq, d)
    case(out, "rotary_4d",
         [helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS)],
         [("x", F, [b, heads, sq, d]), ("pos", TensorProto.INT64, [b, sq])], [("y", F, None)],
         {"x": x4, "pos": pos}, inits=inits)


def fused(out):
    a, bt = randn(2, 3, 4, 5), randn(2, 3, 6, 5)
    case(out, "fused_matmul_trans_b",
         [helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain=MS, transB=1, alpha=0.5)],
         [("a", F, [2, 3, 4, 5]), ("b", F, [2, 3, 6, 5])], [("y", F, None)], {"a": a, "b": bt})
    at, b2 = randn(3, 5, 4), randn(5, 6)
    case(out, "fused_matmul_trans_a",
         [helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain=MS, transA=1)],
         [("a", F, [3, 5, 4]), ("b", F, [5, 6])], [("y", F, None)], {"a": at, "b": b2})
    x, w, bias, z = randn(1, 3, 8, 8), randn(4, 3, 3, 3), randn(4), randn(1, 4, 6, 6)
    conv_in = [("x", F, [1, 3, 8, 8])]
    inits = [("w", w), ("bias", bias)]
    for act, extra in (("Relu", {}), ("Sigmoid", {}), ("Tanh", {}), ("LeakyRelu", {"activation_params": [0.2]}),
                       ("Clip", {"activation_params": [-0.5, 0.5]}), ("HardSigmoid", {"activation_params": [0.3, 0.4]})):
        case(out, f"fused_conv_{act.lower()}",
             [helper.make_node("FusedConv", ["x", "w", "bias"], ["y"], domain=MS, activation=act,
                               kernel_shape=[3, 3], **extra)],
             conv_in, [("y", F, None)], {"x": x}, inits=inits)
    case(out, "fused_conv_sum",
         [helper.make_node("FusedConv", ["x", "w", "bias", "z"], ["y"], domain=MS, activation="Relu",
                           kernel_shape=[3, 3])],
         conv_in + [("z", F, [1, 4, 6, 6])], [("y", F, None)], {"x": x, "z": z}, inits=inits)


def fused_gemm_and_integer(out):
    a, b, c = randn(3, 5), randn(4, 5), randn(4)
    for act, extra in (("Relu", {}), ("LeakyRelu", {"activation_alpha": 0.1}), ("Sigmoid", {}),
                       ("HardSigmoid", {"activation_alpha": 0.3, "activation_beta": 0.4})):
        case(out, f"fused_gemm_{act.lower()}",
             [helper.make_node("FusedGemm", ["a", "b", "c"], ["y"], domain=MS, transB=1, alpha=0.7, beta=0.5,
                               activation=act, **extra)],
             [("a", F, [3, 5]), ("b", F, [4, 5]), ("c", F, [4])], [("y", F, None)], {"a": a, "b": b, "c": c})
    # Dynamic quantisation of A, int8 weights with per-column scales and zero points. The weights
    # stay within 7 bits (as ONNX Runtime's quantiser's reduce_range keeps them): on CPUs without
    # VNNI its u8 x s8 kernel saturates pairs of full-range products, and the reference would be
    # inexact.
    x = randn(2, 6, 16)
    w = RNG.integers(-64, 64, (16, 8)).astype(np.int8)
    ws = (RNG.random(8) * 0.02 + 0.005).astype(np.float32)
    wz = RNG.integers(-3, 4, 8).astype(np.int8)
    bias = randn(8)
    case(out, "dynamic_quantize_matmul",
         [helper.make_node("DynamicQuantizeMatMul", ["x", "w", "ws", "wz", "bias"], ["y"], domain=MS)],
         [("x", F, [2, 6, 16])], [("y", F, None)], {"x": x},
         inits=[("w", w), ("ws", ws), ("wz", wz), ("bias", bias)])
    case(out, "dynamic_quantize_matmul_no_zp",
         [helper.make_node("DynamicQuantizeMatMul", ["x", "w", "ws"], ["y"], domain=MS)],
         [("x", F, [2, 6, 16])], [("y", F, None)], {"x": x}, inits=[("w", w), ("ws", ws[:1])])
    aq = RNG.integers(0, 256, (2, 6, 16)).astype(np.uint8)
    case(out, "matmul_integer_to_float",
         [helper.make_node("MatMulIntegerToFloat", ["aq", "w", "as", "ws", "az", "wz", "bias"], ["y"], domain=MS)],
         [("aq", TensorProto.UINT8, [2, 6, 16])], [("y", F, None)], {"aq": aq},
         inits=[("w", w), ("as", np.array(0.02, np.float32)), ("ws", ws), ("az", np.array(128, np.uint8)),
                ("wz", wz), ("bias", bias)])


def dynamic_quantize_lstm(out):
    """DynamicQuantizeLSTM: 8-bit W and R, a scale and zero point per direction or per direction
    and gate column, bidirectional. ONNX Runtime also quantizes X and H to 8 bits at each step
    while kiln keeps X float and quantizes H to 16 bits, so the outputs agree
    to about that quantization's step, not to the last bit; a wrong gate order or layout would
    miss by the outputs' own size."""
    hs, isz, seq = 8, 6, 5
    for name, per_column in (("dynamic_quantize_lstm", False), ("dynamic_quantize_lstm_per_column", True)):
        pshape = (2, 4 * hs) if per_column else (2,)
        w = RNG.integers(-64, 64, (2, isz, 4 * hs)).astype(np.int8)
        r = RNG.integers(-64, 64, (2, hs, 4 * hs)).astype(np.int8)
        ws = (RNG.random(pshape) * 0.02 + 0.01).astype(np.float32)
        rs = (RNG.random(pshape) * 0.02 + 0.01).astype(np.float32)
        # ONNX Runtime takes symmetric weights only (zero points of 0).
        wz = np.zeros(pshape, np.int8)
        rz = np.zeros(pshape, np.int8)
        b = randn(2, 8 * hs, scale=0.1)
        x = randn(seq, 1, isz)
        node = helper.make_node("DynamicQuantizeLSTM", ["x", "w", "r", "b", "", "", "", "", "ws", "wz", "rs", "rz"],
                                ["y", "yh", "yc"], domain=MS, direction="bidirectional", hidden_size=hs)
        case(out, name, [node], [("x", F, [seq, 1, isz])], [("y", F, None), ("yh", F, None), ("yc", F, None)],
             {"x": x}, inits=[("w", w), ("r", r), ("b", b), ("ws", ws), ("wz", wz), ("rs", rs), ("rz", rz)],
             rtol=5e-2, atol=3e-2)


def qlinear_ops(out):
    """ONNX Runtime's QOperator ops (its quantiser's QOperator format). Each case quantizes float
    inputs with QuantizeLinear, runs the op, and dequantizes its output, so the comparison is in
    floats within one output quantization step (ONNX Runtime's integer arithmetic and kiln's
    expansion into DequantizeLinear -> op -> QuantizeLinear may round a tie differently)."""
    U8 = TensorProto.UINT8

    def q(name, scale, zp):
        return [helper.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}_q"])], [
            (f"{name}_s", np.array(scale, np.float32)), (f"{name}_z", np.array(zp, np.uint8))]

    def run(name, op_nodes, inputs, feeds, y_scale, y_zp, extra_inits=()):
        nodes, inits = [], list(extra_inits)
        for n, scale, zp in inputs:
            qn, qi = q(n, scale, zp)
            nodes += qn
            inits += qi
        inits += [("y_s", np.array(y_scale, np.float32)), ("y_z", np.array(y_zp, np.uint8))]
        nodes += op_nodes
        nodes.append(helper.make_node("DequantizeLinear", ["y_q", "y_s", "y_z"], ["y"]))
        ins = [(n, F, list(feeds[n].shape)) for n, _, _ in inputs]
        case(out, name, nodes, ins, [("y", F, None)], feeds, inits=inits, rtol=0.0, atol=y_scale * 1.01)

    x1, x2 = randn(2, 3, 4), randn(4)
    ab = [("a", 0.02, 128), ("b", 0.03, 100)]
    for op in ("QLinearAdd", "QLinearMul"):
        run(f"{op.lower()[7:]}_qlinear",
            [helper.make_node(op, ["a_q", "a_s", "a_z", "b_q", "b_s", "b_z", "y_s", "y_z"], ["y_q"], domain=MS)],
            ab, {"a": x1, "b": x2}, 0.05, 120)
    xa = randn(2, 3, 8, scale=2.0)
    run("sigmoid_qlinear",
        [helper.make_node("QLinearSigmoid", ["x_q", "x_s", "x_z", "y_s", "y_z"], ["y_q"], domain=MS)],
        [("x", 0.03, 128)], {"x": xa}, 1.0 / 255, 0)
    run("leaky_relu_qlinear",
        [helper.make_node("QLinearLeakyRelu", ["x_q", "x_s", "x_z", "y_s", "y_z"], ["y_q"], domain=MS, alpha=0.2)],
        [("x", 0.03, 128)], {"x": xa}, 0.02, 60)
    run("softmax_qlinear",
        [helper.make_node("QLinearSoftmax", ["x_q", "x_s", "x_z", "y_s", "y_z"], ["y_q"], domain=MS, axis=-1,
                          opset=13)],
        [("x", 0.05, 128)], {"x": xa}, 1.0 / 256, 0)
    run("concat_qlinear",
        [helper.make_node("QLinearConcat", ["y_s", "y_z", "a_q", "a_s", "a_z", "b_q", "b_s", "b_z"], ["y_q"],
                          domain=MS, axis=1)],
        ab, {"a": randn(2, 3, 4), "b": randn(2, 2, 4)}, 0.03, 128)
    img = randn(1, 4, 7, 7)
    run("global_average_pool_qlinear",
        [helper.make_node("QLinearGlobalAveragePool", ["x_q", "x_s", "x_z", "y_s", "y_z"], ["y_q"], domain=MS,
                          channels_last=0)],
        [("x", 0.02, 128)], {"x": img}, 0.01, 128)
    run("average_pool_qlinear",
        [helper.make_node("QLinearAveragePool", ["x_q", "x_s", "x_z", "y_s", "y_z"], ["y_q"], domain=MS,
                          kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=0)],
        [("x", 0.02, 128)], {"x": img}, 0.015, 128)
    # QGemm: int8 weights (7-bit, see above) with per-column scales, an int32 bias, quantized or
    # float output, B transposed or not.
    a = randn(3, 16)
    w = RNG.integers(-64, 64, (16, 6)).astype(np.int8)
    ws = (RNG.random(6) * 0.02 + 0.005).astype(np.float32)
    wz = np.zeros(6, np.int8)
    bias = RNG.integers(-500, 500, 6).astype(np.int32)
    qg = [("w", w), ("ws", ws), ("wz", wz), ("bias", bias)]
    run("qgemm_quantized",
        [helper.make_node("QGemm", ["a_q", "a_s", "a_z", "w", "ws", "wz", "bias", "y_s", "y_z"], ["y_q"], domain=MS)],
        [("a", 0.02, 128)], {"a": a}, 0.04, 128, extra_inits=qg)
    qn, qi = q("a", 0.02, 128)
    case(out, "qgemm_float_trans_b",
         qn + [helper.make_node("QGemm", ["a_q", "a_s", "a_z", "wt", "ws", "wz"], ["y"], domain=MS, transB=1)],
         [("a", F, [3, 16])], [("y", F, None)], {"a": a},
         inits=qi + [("wt", np.ascontiguousarray(w.T)), ("ws", ws), ("wz", wz)], rtol=1e-5, atol=1e-5)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    out = os.path.join(sys.argv[1], "contrib")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    for make in (activations, norms, attention, mha, rotary, fused, fused_gemm_and_integer, qlinear_ops,
                 dynamic_quantize_lstm):
        make(out)
    print(f"{len(os.listdir(out))} com.microsoft cases written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
