#!/usr/bin/env python3
"""Accuracy of int8 models as users judge it: SQNR (dB) of each output against the fp32
model's output, for kiln and for ONNX Runtime running the same int8 model (issue 27's bar:
kiln's SQNR at least ORT's minus 0.5 dB).

    python scripts/int8_accuracy.py ~/kiln-models            # every <name>.int8_*.onnx beside <name>.onnx

Inputs come from <name>.io.npz (`in_<input>` arrays) when present, else random normal
(integer inputs zeros). Needs the kiln package (pip install .) and onnxruntime.
"""

import argparse
import glob
import os
import re

import numpy as np
import onnxruntime as ort

import kiln


def sqnr(ref, got):
    ref = np.asarray(ref, np.float64)
    got = np.asarray(got, np.float64)
    noise = np.sum((ref - got) ** 2)
    signal = np.sum(ref**2)
    if noise == 0:
        return float("inf")
    return 10 * np.log10(signal / noise)


def feeds_for(path, sess):
    io = path.replace(".onnx", ".io.npz")
    if os.path.exists(io):
        z = np.load(io)
        return {k[3:]: z[k] for k in z.files if k.startswith("in_")}
    rng = np.random.default_rng(0)
    out = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        if "float" in i.type:
            out[i.name] = rng.standard_normal(shape).astype(np.float32)
        else:
            out[i.name] = np.zeros(shape, np.int64)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    a = ap.parse_args()
    rows = []
    for q in sorted(glob.glob(os.path.join(os.path.expanduser(a.dir), "*.int8_*.onnx"))):
        base = re.sub(r"\.int8_[a-z]+\.onnx$", ".onnx", q)
        if not os.path.exists(base):
            continue
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        fp = ort.InferenceSession(base, so, providers=["CPUExecutionProvider"])
        feeds = feeds_for(base, fp)
        ref = fp.run(None, feeds)
        try:
            oq = ort.InferenceSession(q, so, providers=["CPUExecutionProvider"]).run(None, feeds)
        except Exception as e:  # noqa: BLE001 - reported, the model skipped
            print(f"{os.path.basename(q)}: ONNX Runtime cannot run it ({str(e).splitlines()[0][:160]})")
            continue
        try:
            kq = list(kiln.Session(q).run(feeds).values())
        except kiln.KilnError as e:
            print(f"{os.path.basename(q)}: kiln failed: {e}")
            continue
        for i, r in enumerate(ref):
            s_ort, s_kiln = sqnr(r, oq[i]), sqnr(r, kq[i])
            rows.append((os.path.basename(q), i, s_ort, s_kiln))
    print(f"{'model':<28} {'out':>3} {'ORT int8 dB':>12} {'kiln int8 dB':>13} {'kiln-ORT':>9}")
    for name, i, so_, sk in rows:
        print(f"{name:<28} {i:>3} {so_:12.2f} {sk:13.2f} {sk - so_:9.2f}")


if __name__ == "__main__":
    main()
