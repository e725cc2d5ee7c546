"""Models the Python tests run: the shipped example CNN, and small graphs built here with
onnx.helper (every dtype kiln passes through numpy, a symbolic batch, strings, a slow MatMul)."""

import pathlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny_cnn.onnx"
EXAMPLE_INPUT = ROOT / "examples" / "tiny_cnn_input.npy"


def _save(model, path):
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    ir = 8 if opset <= 17 else 10
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)


@pytest.fixture(scope="session")
def example():
    return str(EXAMPLE)


@pytest.fixture(scope="session")
def example_input():
    return np.load(EXAMPLE_INPUT)


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    out = {}
    # y = x * 2 + 1 over a symbolic batch: "batch" x 4.
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    out["affine"] = _save(
        _model(
            [helper.make_node("Mul", ["x", "two"], ["t"]), helper.make_node("Add", ["t", "one"], ["y"])],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
            [two, one],
        ),
        d / "affine.onnx",
    )
    # Identity of every plain dtype at once: each input comes back as its output.
    dtypes = {
        "f16": TensorProto.FLOAT16,
        "f64": TensorProto.DOUBLE,
        "i8": TensorProto.INT8,
        "i16": TensorProto.INT16,
        "i32": TensorProto.INT32,
        "i64": TensorProto.INT64,
        "u8": TensorProto.UINT8,
        "u16": TensorProto.UINT16,
        "u32": TensorProto.UINT32,
        "u64": TensorProto.UINT64,
        "b": TensorProto.BOOL,
        "s": TensorProto.STRING,
        "bf16": TensorProto.BFLOAT16,
    }
    out["identity"] = _save(
        _model(
            [helper.make_node("Identity", [f"in_{k}"], [f"out_{k}"]) for k in dtypes],
            [helper.make_tensor_value_info(f"in_{k}", t, [2, 3]) for k, t in dtypes.items()],
            [helper.make_tensor_value_info(f"out_{k}", t, [2, 3]) for k, t in dtypes.items()],
        ),
        d / "identity.onnx",
    )
    # The types numpy has only through ml_dtypes (float8, int4): Identity, opset 21.
    coded = {"f8": TensorProto.FLOAT8E4M3FN, "f8e5": TensorProto.FLOAT8E5M2, "i4": TensorProto.INT4, "u4": TensorProto.UINT4}
    out["identity_coded"] = _save(
        _model(
            [helper.make_node("Identity", [f"in_{k}"], [f"out_{k}"]) for k in coded],
            [helper.make_tensor_value_info(f"in_{k}", t, [2, 4]) for k, t in coded.items()],
            [helper.make_tensor_value_info(f"out_{k}", t, [2, 4]) for k, t in coded.items()],
            opset=21,
        ),
        d / "identity_coded.onnx",
    )
    # Arithmetic in several dtypes, to compare with ONNX Runtime.
    out["mixed"] = _save(
        _model(
            [
                helper.make_node("Add", ["a16", "a16"], ["sum16"]),
                helper.make_node("Mul", ["i", "i"], ["sq"]),
                helper.make_node("Not", ["flag"], ["notflag"]),
                helper.make_node("Cast", ["i"], ["as_float"], to=TensorProto.FLOAT),
            ],
            [
                helper.make_tensor_value_info("a16", TensorProto.FLOAT16, [3, 5]),
                helper.make_tensor_value_info("i", TensorProto.INT32, [3, 5]),
                helper.make_tensor_value_info("flag", TensorProto.BOOL, [3, 5]),
            ],
            [
                helper.make_tensor_value_info("sum16", TensorProto.FLOAT16, [3, 5]),
                helper.make_tensor_value_info("sq", TensorProto.INT32, [3, 5]),
                helper.make_tensor_value_info("notflag", TensorProto.BOOL, [3, 5]),
                helper.make_tensor_value_info("as_float", TensorProto.FLOAT, [3, 5]),
            ],
        ),
        d / "mixed.onnx",
    )
    # A run long enough to observe other threads running meanwhile (a chain of 512^2 MatMuls).
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, [512, 512], (rng.standard_normal((512, 512)) / 23).astype(np.float32).ravel())
    nodes, prev = [], "x"
    for k in range(24):
        nodes.append(helper.make_node("MatMul", [prev, "w"], [f"h{k}"]))
        prev = f"h{k}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    out["slow"] = _save(
        _model(
            nodes,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 512])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 512])],
            [w],
        ),
        d / "slow.onnx",
    )
    # y = x + 1, m times (a Loop whose trip count is an input): as long a run as one asks for.
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["acc_in", "one_f"], ["acc_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("iter", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor("one_f", TensorProto.FLOAT, [1], [1.0])],
    )
    out["loop"] = _save(
        _model(
            [helper.make_node("Loop", ["m", "cond", "x"], ["y"], name="the_loop", body=body)],
            [
                helper.make_tensor_value_info("m", TensorProto.INT64, []),
                helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        ),
        d / "loop.onnx",
    )
    # y = Expand(x, shape): an output as large as the shape input says.
    out["expand"] = _save(
        _model(
            [helper.make_node("Expand", ["x", "shape"], ["y"], name="grow")],
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
                helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])],
        ),
        d / "expand.onnx",
    )
    return out
