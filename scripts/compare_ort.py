"""Run ONNX models through kiln (the CLI) and ONNX Runtime on the same inputs and report how
far apart the outputs are. Inputs come from `<model>.io.npz` (keys `in_<name>`, as
../shared/bench/make_models.py and scripts/make_corpus.py write them) or are random. A directory
argument stands for the models its corpus.json lists (else its *.onnx files).

usage: python scripts/compare_ort.py [--kiln target/release/kiln] [--rtol 1e-4] [--opt-level N]
       [--via-program] MODEL.onnx|DIR|corpus.json...
Exit status 1 when any output differs by more than rtol (relative to the output's max |value|,
elementwise with an atol of rtol * max|ref|).
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

from model_paths import expand_models


def inputs_for(model_path, sess):
    # resnet50.int8_qdq.onnx reads resnet50.io.npz.
    base = os.path.basename(model_path).split(".")[0]
    io = os.path.join(os.path.dirname(model_path), base + ".io.npz")
    if os.path.exists(io):
        d = np.load(io)
        return {i.name: d["in_" + i.name] for i in sess.get_inputs()}
    rng = np.random.default_rng(0)
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        if "int" in i.type:
            feeds[i.name] = rng.integers(0, 2, size=shape).astype(np.int64)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="target/release/kiln")
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--opt-level", type=int, default=None,
                    help="compile at this level (0-3; default: kiln's default, 2)")
    ap.add_argument("--via-program", action="store_true",
                    help="compile each model to a .kiln program first and run that")
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    bad = skipped = 0
    for path in expand_models(a.models):
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            feeds = inputs_for(path, sess)
            ref = sess.run(None, feeds)
        except Exception as e:  # ONNX Runtime refuses some models kiln runs: no reference
            print(f"{os.path.basename(path)}: skipped, ONNX Runtime cannot run it: {str(e).splitlines()[0][:300]}")
            skipped += 1
            continue
        with tempfile.TemporaryDirectory() as tmp:
            npz = os.path.join(tmp, "in.npz")
            np.savez(npz, **feeds)
            out = os.path.join(tmp, "out")
            t0 = time.time()
            level = [] if a.opt_level is None else ["--opt-level", str(a.opt_level)]
            target = path
            if a.via_program:
                target = os.path.join(tmp, "model.kiln")
                c = subprocess.run([a.kiln, "compile", path, "-o", target, "--quiet", *level],
                                   capture_output=True, text=True)
                if c.returncode != 0:
                    print(f"{os.path.basename(path)}: kiln compile failed: {c.stderr.strip()}")
                    bad += 1
                    continue
                level = []
            r = subprocess.run([a.kiln, "run", target, "--inputs", npz, "--output-dir", out, *level],
                               capture_output=True, text=True)
            dt = time.time() - t0
            if r.returncode != 0:
                print(f"{os.path.basename(path)}: kiln failed: {r.stderr.strip()}")
                bad += 1
                continue
            for o, want in zip(sess.get_outputs(), ref):
                name = "".join(c if c.isalnum() or c in "._-" else "_" for c in o.name)
                got_path = os.path.join(out, name + ".npy")
                if not os.path.exists(got_path):
                    print(f"{os.path.basename(path)}: output {o.name}: kiln wrote no {name}.npy")
                    bad += 1
                    continue
                got = np.load(got_path)
                if got.shape != want.shape:
                    err = float("inf")
                elif want.size == 0:
                    err = 0.0
                else:
                    scale = float(np.max(np.abs(want))) or 1.0
                    err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) / scale
                ok = got.shape == want.shape and err <= a.rtol
                bad += not ok
                shape = f"kiln's shape {list(got.shape)} " if got.shape != want.shape else ""
                print(f"{os.path.basename(path)}: output {o.name} {want.dtype}{list(want.shape)} {shape}"
                      f"max|kiln-ort|/max|ort| = {err:.2e} {'ok' if ok else 'MISMATCH'} (kiln run {dt:.1f}s incl. load)")
    if skipped:
        print(f"{skipped} model(s) skipped: no ONNX Runtime reference")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
