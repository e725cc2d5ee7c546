"""Session creation time: kiln opening a compiled .kiln program vs ONNX Runtime creating an
InferenceSession on the same .onnx model, in one run on one machine, median of N alternating
repetitions each.

kiln's figure is the `load_s` of `kiln bench PROGRAM.kiln -n 1 --json` (Session::new: open,
memory-map, checksum every section, decode the program); each repetition is a fresh process with
the file in the page cache. ORT's is `ort.InferenceSession(path)` with default options (graph
optimisations on, CPU provider), timed in this process after one warm-up creation.

usage: python scripts/load_time.py [--kiln target/release/kiln] [-n 7] MODEL.onnx...
The .kiln is compiled next to a temporary copy (default options) before timing.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import onnxruntime as ort


def kiln_load(kiln, program):
    out = subprocess.run([kiln, "bench", program, "-n", "1", "--warmup", "0", "--json", "--quiet"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["load_s"]


def ort_load(model):
    t = time.perf_counter()
    ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="target/release/kiln")
    ap.add_argument("-n", type=int, default=7)
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    print(f"{'model':<18} {'kiln .kiln load':>16} {'ORT session':>12} {'ORT/kiln':>9}")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for m in a.models:
            name = os.path.basename(m).removesuffix(".onnx")
            program = os.path.join(tmp, name + ".kiln")
            subprocess.run([a.kiln, "compile", m, "-o", program, "--quiet"], check=True)
            ort_load(m)
            ks, os_ = [], []
            for _ in range(a.n):
                ks.append(kiln_load(a.kiln, program))
                os_.append(ort_load(m))
            k, o = statistics.median(ks), statistics.median(os_)
            ratios.append(o / k)
            print(f"{name:<18} {k * 1e3:>13.1f} ms {o * 1e3:>9.1f} ms {o / k:>8.1f}x")
    print(f"geometric mean ORT/kiln: {statistics.geometric_mean(ratios):.1f}x "
          f"(median of {a.n}; shared, noisy machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
