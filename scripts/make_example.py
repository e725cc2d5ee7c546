"""Build the small default model shipped in examples/ (a seeded random CNN classifier), an input
for it, and ONNX Runtime's output for that input (the reference the CLI test compares with).

usage: python scripts/make_example.py examples
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def main() -> None:
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(7)

    def w(name, *shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [
        w("conv1_w", 8, 3, 3, 3), w("conv1_b", 8),
        w("bn_scale", 8, scale=0.1), w("bn_bias", 8), w("bn_mean", 8),
        numpy_helper.from_array(np.abs(rng.standard_normal(8)).astype(np.float32) + 0.5, "bn_var"),
        w("conv2_w", 16, 8, 3, 3), w("conv2_b", 16),
        w("fc_w", 16, 10), w("fc_b", 10),
        numpy_helper.from_array(np.array([1, 16], dtype=np.int64), "flat_shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "conv1_w", "conv1_b"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("BatchNormalization", ["c1", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["b1"], name="bn1"),
        helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
        helper.make_node("Conv", ["p1", "conv2_w", "conv2_b"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        helper.make_node("Reshape", ["g", "flat_shape"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], name="fc"),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="softmax"),
    ]
    graph = helper.make_graph(
        nodes, "tiny_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kiln-example")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(out, "tiny_cnn.onnx"))
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.save(os.path.join(out, "tiny_cnn_input.npy"), x)
    import onnxruntime as ort
    sess = ort.InferenceSession(os.path.join(out, "tiny_cnn.onnx"), providers=["CPUExecutionProvider"])
    (probs,) = sess.run(None, {"image": x})
    np.save(os.path.join(out, "tiny_cnn_expected_probs.npy"), probs)
    print("wrote", out)


if __name__ == "__main__":
    main()
