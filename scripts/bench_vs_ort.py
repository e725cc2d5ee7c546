"""kiln against ONNX Runtime, side by side, in one run on one machine: per model and thread count,
kiln ms, ORT ms, kiln/ORT, kiln's GFLOP/s and its share of the 117 GFLOP/s single-core peak, and
the geometric mean of the ratios.

Method: each model is compiled to a .kiln once (default options). Then, for R rounds, kiln and ORT
alternate (A B A B): kiln runs `kiln bench PROGRAM -n K --json` (a warm-up of about WARMUP_S
seconds, as ORT's session is warm from the earlier rounds, then K timed inferences; the round's
sample is their median) and ORT times K runs of the same inputs after a
warm-up run (the round's sample is their median). K is about ROUND_S seconds of runs (at least
5, from a probe of kiln's latency; the same K for both). The figure per runtime is the median of
the R round samples (R x K >= 45 runs each by default), and the ratio is the median of the R
per-round ratios (each round's kiln sample over the ORT sample taken right after it): the load
from other tenants of this shared VM varies over seconds, and pairing compares the two runtimes
under the same conditions instead of letting a few loaded rounds move one runtime's median.
It does not hide kiln's own 2-thread slow epochs: when the host places the VM's two vCPUs far
apart (a cache-line round trip between two threads of ~320 ns instead of ~70 ns), kiln runs
slower (ResNet-18's per-layer profile: 21 ms instead of 13-16 since Winograd keeps each thread on
its own tiles, 24 before; data one core wrote and the other reads costs that round trip) while
ONNX Runtime is barely affected; rounds in such an epoch raise the ratio, as they should. `kiln bench`
measures that round trip before and after each round (`thread_round_trip_ns`), and each
multi-thread row says how many of its rounds ran far apart (over FAR_NS). Each row
also shows the spread of the per-round ratios (their lower and upper quartile). ORT uses ORT_ENABLE_ALL and
intra_op_num_threads = T; kiln gets num_of_cores = T (its own pool: the caller plus T - 1
workers). Inputs come from `<model>.io.npz` (keys `in_<name>`) or
are random; a directory argument stands for the models its corpus.json lists (scripts/make_corpus.py)
or else its *.onnx files. FLOPs = 2 x the MACs `kiln info` reports, i.e. the direct method's: layers kiln runs
as Winograd do fewer, so kiln's GFLOP/s there are effective figures (and may exceed the peak).

With --openvino, OpenVINO (the `openvino` pip package, CPU plugin, LATENCY hint,
INFERENCE_NUM_THREADS = T and INFERENCE_PRECISION_HINT f32, so no BF16 on AVX-512 BF16 hardware)
joins each round after ORT (A B C A B C), with its ms and kiln/OV ratio, paired the same way.

With --kiln-b PATH, a second kiln binary (another commit's build) compiles its own program and
runs beside the first in each round (A B ORT, then B A ORT, alternating, so neither kiln gains
from its place), and each row adds its ms and the paired ratio B/A: a before/after comparison
of two kilns under the same conditions.

usage: python scripts/bench_vs_ort.py [--kiln target/release/kiln] [--kiln-b OTHER_KILN]
       [--threads 1,2] [--rounds 9] [--per-round K] [--openvino] MODEL.onnx|DIR|corpus.json...
The machine may be shared and noisy: compare ratios from one run, not figures across runs.
"""
import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

from model_paths import expand_models

PEAK_GFLOPS = 117.0


def ort_session(model, threads):
    """An ONNX Runtime session as the comparison runs it: ORT_ENABLE_ALL, `threads` intra-op
    threads, one inter-op thread, the CPU provider."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def feeds_for(model, sess):
    base = os.path.basename(model).split(".")[0]
    io = os.path.join(os.path.dirname(model), base + ".io.npz")
    if os.path.exists(io):
        d = np.load(io)
        return {i.name: d["in_" + i.name] for i in sess.get_inputs()}
    rng = np.random.default_rng(0)
    out = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        out[i.name] = (rng.integers(0, 2, size=shape).astype(np.int64) if "int" in i.type
                       else rng.standard_normal(shape).astype(np.float32))
    return out


def macs(kiln, model, sess=None, feeds=None):
    """The MACs `kiln info` counts, with the model's symbolic input dims bound to the feeds' sizes
    (kiln counts none while a dim is symbolic)."""
    symbols = []
    for i in (sess.get_inputs() if sess else []):
        for d, v in zip(i.shape, feeds[i.name].shape):
            if isinstance(d, str) and d != "?":
                symbols += ["--define-symbol", f"{d}={v}"]
    r = subprocess.run([kiln, "info", model, *symbols], capture_output=True, text=True)
    m = re.search(r"^MACs\s+([\d,]+)", r.stdout, re.M)
    return int(m.group(1).replace(",", "")) if m else None


def kiln_round(kiln, program, npz, k, threads, warmup=1):
    out = subprocess.run([kiln, "bench", program, "--inputs", npz, "-n", str(k), "--warmup", str(warmup), "--json",
                          "--quiet", "-O", f"num_of_cores={threads}"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def trip_ns(report):
    """The larger of the threads' round trips before and after a kiln round (None on 1 thread)."""
    rt = report.get("thread_round_trip_ns") or {}
    sides = [v for v in (rt.get("before"), rt.get("after")) if isinstance(v, (int, float))]
    return max(sides) if sides else None


# Rounds whose threads' round trip exceeds this many ns ran with the two vCPUs placed far apart.
FAR_NS = 250


# A fresh process runs its first ~0.2 s slowly (measured: MobileNet-v2 on 2 threads, p50 of
# runs 2-6 at 8-9 ms, of runs 2-81 at 4.6-5.4 ms; on 1 thread 9-10 against 7.7 ms) while the
# OS settles its threads, and ORT's session stays warm across rounds. So each kiln round
# first warms up for about this long, as a count of runs from a probe of the model's latency.
WARMUP_S = 0.5


# Each round times both runtimes for about this long (at least 5 runs each): a burst of load
# from other tenants then moves one round's median, not the result (5 runs of MobileNet-v2
# were 35 ms, which one burst could cover whole).
ROUND_S = 0.3


def probe_ms(kiln, program, npz, threads):
    return max(kiln_round(kiln, program, npz, 3, threads)["latency_ms"]["p50"], 1e-3)


def runs_for(seconds, probe):
    return max(1, min(500, int(seconds * 1e3 / probe) + 1))


def timed_round(run, k):
    """The median ms of k calls of run() after one untimed call."""
    run()
    times = []
    for _ in range(k):
        t = time.perf_counter()
        run()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def openvino_runner(model, threads, feeds):
    """A callable running one OpenVINO CPU inference of `model` on `feeds` (fp32, `threads`
    inference threads, the LATENCY hint)."""
    import openvino as ov
    compiled = ov.Core().compile_model(model, "CPU", {
        "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": "f32"})
    req = compiled.create_infer_request()
    ov_feeds = {i.get_any_name(): feeds[i.get_any_name()] for i in compiled.inputs}
    return lambda: req.infer(ov_feeds)


def paired(ks, others):
    """The median of the per-round ratios and their lower and upper quartile."""
    rs = sorted(k / o for k, o in zip(ks, others))
    r = statistics.median(rs)
    q = statistics.quantiles(rs, n=4) if len(rs) > 1 else [r, r, r]
    return r, (q[0], q[2])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="target/release/kiln")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--per-round", type=int, default=0,
                    help="timed runs per round and runtime (default: about ROUND_S seconds' worth, at least 5)")
    ap.add_argument("--kiln-b", default=None,
                    help="a second kiln binary, timed after the first in each round (ratio B/A)")
    ap.add_argument("--openvino", action="store_true",
                    help="also time OpenVINO (fp32, CPU plugin) in each round")
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    rows = []
    per_rounds = []
    skipped = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in expand_models(a.models):
            name = os.path.basename(model).removesuffix(".onnx")
            program = os.path.join(tmp, name + ".kiln")
            program_b = os.path.join(tmp, name + ".b.kiln")
            try:
                subprocess.run([a.kiln, "compile", model, "-o", program, "--quiet"], check=True,
                               capture_output=True, text=True)
                if a.kiln_b:
                    subprocess.run([a.kiln_b, "compile", model, "-o", program_b, "--quiet"], check=True,
                                   capture_output=True, text=True)
            except subprocess.CalledProcessError as e:  # one model kiln cannot take does not end the run
                print(f"{name:<14} skipped: kiln compile failed: {e.stderr.strip()}", flush=True)
                skipped.append(name)
                continue
            flops = None
            for t in threads:
                try:
                    sess = ort_session(model, t)
                except Exception as e:  # nor one ONNX Runtime cannot load
                    print(f"{name:<14} skipped: ONNX Runtime cannot load it: {str(e)[:300]}", flush=True)
                    skipped.append(name)
                    break
                feeds = feeds_for(model, sess)
                try:
                    sess.run(None, feeds)
                except Exception as e:  # nor one it cannot run on these inputs
                    print(f"{name:<14} skipped: ONNX Runtime cannot run it: {str(e)[:300]}", flush=True)
                    skipped.append(name)
                    break
                if flops is None:
                    flops = (macs(a.kiln, model, sess, feeds) or 0) * 2
                npz = os.path.join(tmp, name + ".in.npz")
                np.savez(npz, **feeds)
                ov_run = None
                if a.openvino:
                    try:
                        ov_run = openvino_runner(model, t, feeds)
                    except Exception as e:  # OpenVINO cannot read every model: time the others
                        print(f"{name:<14} T={t}  OpenVINO failed: {str(e).strip().splitlines()[-1]}", flush=True)
                ks, os_, vs, trips, bs = [], [], [], [], []
                probe = probe_ms(a.kiln, program, npz, t)
                warmup = runs_for(WARMUP_S, probe)
                per_round = a.per_round or max(5, runs_for(ROUND_S, probe))
                for r in range(a.rounds):
                    # With a second kiln, the two swap places every other round, so neither
                    # takes the first place every round (a place in the round must not bias B/A).
                    b_first = a.kiln_b and r % 2 == 1
                    if b_first:
                        bs.append(kiln_round(a.kiln_b, program_b, npz, per_round, t, warmup)["latency_ms"]["p50"])
                    rep = kiln_round(a.kiln, program, npz, per_round, t, warmup)
                    ks.append(rep["latency_ms"]["p50"])
                    trips.append(trip_ns(rep))
                    if a.kiln_b and not b_first:
                        bs.append(kiln_round(a.kiln_b, program_b, npz, per_round, t, warmup)["latency_ms"]["p50"])
                    os_.append(timed_round(lambda: sess.run(None, feeds), per_round))
                    if ov_run:
                        vs.append(timed_round(ov_run, per_round))
                per_rounds.append(per_round)
                k, o = statistics.median(ks), statistics.median(os_)
                r, iqr = paired(ks, os_)
                v, rv = (statistics.median(vs), paired(ks, vs)[0]) if vs else (None, None)
                gflops = flops / (k * 1e-3) / 1e9 if flops else float("nan")
                measured = [x for x in trips if x is not None]
                far = f"{sum(x > FAR_NS for x in measured)}/{len(measured)}" if measured else "-"
                b, rb = (statistics.median(bs), paired(bs, ks)) if bs else (None, None)
                rows.append((name, t, k, o, r, iqr, gflops, far, v, rv, b, rb))
                ov_text = f"OV {v:9.2f} ms  kiln/OV {rv:6.2f}  " if vs else ""
                if bs:
                    ov_text += f"kiln-b {b:9.2f} ms  B/A {rb[0]:6.3f} ({rb[1][0]:.3f}-{rb[1][1]:.3f})  "
                print(f"{name:<14} T={t}  kiln {k:9.2f} ms  ORT {o:9.2f} ms  kiln/ORT {r:6.2f} "
                      f"({iqr[0]:.2f}-{iqr[1]:.2f})  {ov_text}"
                      f"kiln {gflops:6.1f} GFLOP/s = {100 * gflops / (PEAK_GFLOPS * t):5.1f}% of peak  "
                      f"far rounds {far}  trips {' '.join('-' if x is None else f'{x:.0f}' for x in trips)} ns",
                      flush=True)
    print()
    print(f"{'model':<14} {'threads':>7} {'kiln ms':>9} {'ORT ms':>9} {'kiln/ORT':>9} {'IQR':>11} "
          f"{'GFLOP/s':>8} {'% peak':>7} {'far':>5}" + (f" {'OV ms':>9} {'kiln/OV':>8}" if a.openvino else "")
          + (f" {'B ms':>9} {'B/A':>7}" if a.kiln_b else ""))
    for name, t, k, o, r, (lo, hi), g, far, v, rv, b, rb in rows:
        print(f"{name:<14} {t:>7} {k:>9.2f} {o:>9.2f} {r:>9.2f} {f'{lo:.2f}-{hi:.2f}':>11} {g:>8.1f} "
              f"{100 * g / (PEAK_GFLOPS * t):>6.1f}% {far:>5}" + (f" {v:>9.2f} {rv:>8.2f}" if v else "")
              + (f" {b:>9.2f} {rb[0]:>7.3f}" if b else ""))
    for t in threads:
        rs = [row[4] for row in rows if row[1] == t]
        if rs:
            print(f"geometric mean kiln/ORT, {t} thread(s): {statistics.geometric_mean(rs):.2f}")
        rvs = [row[9] for row in rows if row[1] == t and row[9]]
        if rvs:
            print(f"geometric mean kiln/OV, {t} thread(s): {statistics.geometric_mean(rvs):.2f}")
        rbs = [row[11][0] for row in rows if row[1] == t and row[11]]
        if rbs:
            print(f"geometric mean kiln-b/kiln, {t} thread(s): {statistics.geometric_mean(rbs):.3f}")
    if skipped:
        print(f"skipped (kiln compile failed, or ONNX Runtime cannot load or run it): {', '.join(skipped)}")
    print(f"(ms: median of {a.rounds} rounds x {min(per_rounds, default=0)}-{max(per_rounds, default=0)} runs "
          "per runtime, interleaved; kiln/ORT: median of the per-round ratios, IQR their quartiles; "
          f"far: kiln rounds whose threads' cache-line round trip exceeded {FAR_NS} ns, i.e. the host "
          "had placed the two vCPUs far apart; shared, noisy machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
