#!/usr/bin/env python3
"""kiln against ONNX Runtime in one process, one inference each in turn (a measurement, not a
test). On a shared, noisy host the speed of one binary moves by 1.5x between minutes, and
`bench_vs_ort.py` alternates whole batches of runs in separate processes; here every kiln
inference has an ORT inference of the same inputs right before it, so both see the same
moment of the host, and the per-pair ratio's median is steady where the separate medians are
not. Needs the kiln Python package in the venv (`pip install .`). Inputs: `<model>.feeds.npz`
(scripts/make_corpus.py writes one), else `<model>.io.npz`, else random.

With --openvino, an OpenVINO inference (CPU plugin, LATENCY hint, f32, as bench_vs_ort.py
runs it) joins each pair (ORT, OpenVINO, kiln), and the ratio is kiln over the faster of the
two peers in that turn, the figure issue 26 judges by; a model OpenVINO cannot load is
compared with ORT alone.

usage: python scripts/interleave_ort.py [--threads 1] [--pairs 30] [--seconds 60] [--openvino]
       MODEL.onnx|DIR|corpus.json...
Prints per model: ORT (and OpenVINO) and kiln medians (ms), the median and quartiles of kiln
over the (faster) peer per turn.
"""

import argparse
import os
import sys
import time

import numpy as np

import kiln
from bench_vs_ort import feeds_for, openvino_runner, ort_session
from model_paths import expand_models


def feeds(model, sess):
    path = os.path.join(os.path.dirname(model), os.path.basename(model).split(".")[0] + ".feeds.npz")
    if os.path.exists(path):
        with np.load(path) as d:
            return {k: d[k] for k in d.files}
    return feeds_for(model, sess)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=30, help="inference pairs per model (at most)")
    ap.add_argument("--seconds", type=float, default=60.0, help="time cap per model (at least 5 pairs)")
    ap.add_argument("--openvino", action="store_true", help="OpenVINO in each turn too; ratio over the faster peer")
    a = ap.parse_args()
    ratios = []
    peer = "peer" if a.openvino else "ORT"
    print(f"{'model':30s} {'ORT ms':>9s}" + (f" {'OV ms':>9s}" if a.openvino else "")
          + f" {'kiln ms':>9s} {'kiln/' + peer:>9s} {'quartiles':>13s} pairs")
    for model in expand_models(a.models):
        name = os.path.basename(model)[:-5]
        try:
            o = ort_session(model, a.threads)
            f = feeds(model, o)
            k = kiln.Session(model, num_of_cores=a.threads)
            for _ in range(2):
                o.run(None, f)
                k.run(f)
        except Exception as e:  # one model a runtime cannot take does not end the run
            print(f"{name:30s} skipped: {str(e).splitlines()[0][:100]}", flush=True)
            continue
        ov = None
        if a.openvino:
            try:
                ov = openvino_runner(model, a.threads, f)
                ov()
            except Exception as e:  # compared with ORT alone
                print(f"{name:30s} OpenVINO failed: {str(e).splitlines()[0][:100]}", flush=True)
                ov = None
        to, tv, tk = [], [], []
        end = time.perf_counter() + a.seconds
        while len(to) < a.pairs and (len(to) < 5 or time.perf_counter() < end):
            t = time.perf_counter()
            o.run(None, f)
            to.append(time.perf_counter() - t)
            if ov is not None:
                t = time.perf_counter()
                ov()
                tv.append(time.perf_counter() - t)
            t = time.perf_counter()
            k.run(f)
            tk.append(time.perf_counter() - t)
        best = np.minimum(np.array(to), np.array(tv)) if tv else np.array(to)
        r = np.array(tk) / best
        q1, med, q3 = np.percentile(r, [25, 50, 75])
        ratios.append(med)
        ov_ms = (f" {np.median(tv) * 1e3:9.2f}" if tv else f" {'-':>9s}") if a.openvino else ""
        print(f"{name:30s} {np.median(to) * 1e3:9.2f}{ov_ms} {np.median(tk) * 1e3:9.2f} {med:9.3f} "
              f"{q1:6.3f}-{q3:6.3f} {len(r):5d}", flush=True)
    if ratios:
        print(f"geometric mean of the medians kiln/{peer}, {a.threads} thread(s): "
              f"{float(np.exp(np.mean(np.log(ratios)))):.3f} over {len(ratios)} models")
    return 0


if __name__ == "__main__":
    sys.exit(main())
