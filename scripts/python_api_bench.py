#!/usr/bin/env python3
"""Measures kiln's Python API (a measurement, not a test; the machine is shared and noisy):

1. per-call overhead: `kiln.Session.run` against ONNX Runtime's `InferenceSession.run` on tiny
   models, side by side in one process, median of several rounds;
2. Python `run()` latency against `Session.run_benchmark` (timed in Rust, what `kiln bench`
   reports) on MODEL (default: the shipped tiny CNN; pass e.g. mobilenet_v2.onnx);
3. throughput against `num_activations`: `run_benchmark` with 1, 2, 4 activations, and Python
   threads sharing one Session.

    python scripts/python_api_bench.py [--model mobilenet_v2.onnx] [--rounds 5]
"""

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

import kiln

ROOT = Path(__file__).resolve().parents[1]


def tiny_add(path):
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])],
        "add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def per_call(fn, n):
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def feeds_for(session):
    out = {}
    rng = np.random.default_rng(0)
    for name, (shape, dtype) in session.model_input_shape_dict().items():
        shape = tuple(d if isinstance(d, int) else 1 for d in shape)
        out[name] = rng.standard_normal(shape).astype(dtype) if "float" in dtype else np.zeros(shape, dtype)
    return out


def overhead(model, rounds, n):
    k = kiln.Session(model)
    o = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    o = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    feeds = feeds_for(k)
    ks, os_ = [], []
    for _ in range(rounds):
        ks.append(per_call(lambda: k.run(feeds), n))
        os_.append(per_call(lambda: o.run(None, feeds), n))
    km, om = statistics.median(ks), statistics.median(os_)
    print(f"  {Path(model).name:<24} kiln {km * 1e6:8.2f} us/call   ORT {om * 1e6:8.2f} us/call   kiln/ORT {km / om:.3f}")


def python_vs_rust(model, rounds, threads):
    s = kiln.Session(model, num_of_cores=threads)
    feeds = feeds_for(s)
    py, rust = [], []
    for _ in range(rounds):
        s.run(feeds)
        lat = []
        for _ in range(30):
            t0 = time.perf_counter()
            s.run(feeds)
            lat.append(time.perf_counter() - t0)
        py.append(statistics.median(lat))
        done, rate, took, _ = s.run_benchmark(num_inferences=30, input_dict=feeds)
        rust.append(took / done)
    pm, rm = statistics.median(py), statistics.median(rust)
    print(f"  {Path(model).name}: Python run() {pm * 1e3:.3f} ms, run_benchmark (Rust) {rm * 1e3:.3f} ms/inference, "
          f"Python/Rust {pm / rm:.3f}")


def activations(model, seconds):
    for a in [1, 2, 4]:
        s = kiln.Session(model, num_activations=a)
        feeds = feeds_for(s)
        done, rate, _, _ = s.run_benchmark(inf_time=seconds, input_dict=feeds)
        # The same from Python: `a` threads calling run() on the one Session.
        count = [0] * a
        stop = time.perf_counter() + seconds

        def worker(i):
            while time.perf_counter() < stop:
                s.run(feeds)
                count[i] += 1

        ts = [threading.Thread(target=worker, args=(i,)) for i in range(a)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        py_rate = sum(count) / (time.perf_counter() - t0)
        print(f"  num_activations={a}: run_benchmark {rate:9.1f} inf/s   {a} Python thread(s) {py_rate:9.1f} inf/s")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "examples" / "tiny_cnn.onnx"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="num_of_cores for the latency comparison")
    ap.add_argument("--seconds", type=float, default=2.0, help="per num_activations setting")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        print(f"kiln {kiln.__version__}, onnxruntime {ort.__version__}")
        print("per-call time from Python (1 thread each; median of rounds):")
        overhead(tiny_add(str(Path(d) / "add16.onnx")), a.rounds, 20000)
        overhead(str(ROOT / "examples" / "tiny_cnn.onnx"), a.rounds, 5000)
        print("Python run() vs run_benchmark (median of rounds):")
        python_vs_rust(a.model, a.rounds, a.threads)
        print("throughput against num_activations:")
        activations(a.model, a.seconds)


if __name__ == "__main__":
    main()
