"""Peak resident memory of kiln against ONNX Runtime on the same models: per model and thread count,
the peak RSS of `kiln bench PROGRAM -n N` (the compiled .kiln, as a user runs it) and of a Python
process that creates an ONNX Runtime session (as `bench_vs_ort.py` does: ORT_ENABLE_ALL,
intra_op_num_threads = T) and runs the same N inferences on the same inputs (`bench_vs_ort.py`'s
`feeds_for`). Each figure is the whole process's high-water mark (getrusage(RUSAGE_CHILDREN).ru_maxrss
of a fresh wrapper process), so the ORT side includes the Python interpreter with numpy and
onnxruntime imported; that baseline is printed too (`python+ort` below) so it can be subtracted by eye.

usage: python scripts/peak_memory.py [--kiln target/release/kiln] [--threads 1,2] [-n 20]
       MODEL.onnx...
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

from bench_vs_ort import feeds_for, ort_session

WRAP = (
    "import resource, subprocess, sys\n"
    "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)\n"
    "if r.returncode != 0:\n"
    "    sys.exit('failed: ' + ' '.join(sys.argv[1:]) + '\\n' + r.stderr[-2000:])\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)


def peak_kib(cmd):
    out = subprocess.run([sys.executable, "-c", WRAP] + cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(out.stderr.strip() or out.stdout.strip())
    return int(out.stdout.strip())


def ort_child(model, threads, n):
    """The measured ONNX Runtime process: `n` inferences (none: the import baseline)."""
    if n == 0:
        return
    sess = ort_session(model, threads)
    feeds = feeds_for(model, sess)
    for _ in range(n):
        sess.run(None, feeds)


def main():
    if sys.argv[1:2] == ["--ort-child"]:
        model, threads, n = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        return ort_child(model, threads, n)
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="target/release/kiln")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    me = os.path.abspath(__file__)
    base = peak_kib([sys.executable, me, "--ort-child", "-", "1", "0"])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models:
            name = os.path.basename(model).split(".")[0]
            prog = os.path.join(tmp, name + ".kiln")
            subprocess.run([a.kiln, "compile", model, "-o", prog, "-q"], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            # The inputs ORT gets, written for kiln under their own names.
            npz = os.path.join(tmp, name + ".in.npz")
            np.savez(npz, **feeds_for(model, ort_session(model, 1)))
            for t in threads:
                k = peak_kib([a.kiln, "bench", prog, "-n", str(a.n), "-q", "-O", f"num_of_cores={t}",
                              "--inputs", npz])
                o = peak_kib([sys.executable, me, "--ort-child", model, str(t), str(a.n)])
                rows.append((name, t, k, o))
                print(f"{name:14} T={t}  kiln {k / 1024:8.1f} MiB  ORT {o / 1024:8.1f} MiB  "
                      f"kiln/ORT {k / o:5.2f}", flush=True)
    print(f"\npython+ort baseline (interpreter, numpy and onnxruntime imported, no session): "
          f"{base / 1024:.1f} MiB")
    print(f"{'model':14} {'threads':>7} {'kiln MiB':>9} {'ORT MiB':>9} {'ORT-base':>9} {'kiln/ORT':>9}")
    for name, t, k, o in rows:
        print(f"{name:14} {t:7} {k / 1024:9.1f} {o / 1024:9.1f} {(o - base) / 1024:9.1f} {k / o:9.2f}")


if __name__ == "__main__":
    main()
