#!/usr/bin/env python3
"""Soak: many runs of a model in one process, resident memory sampled as they go.

    python scripts/soak.py                          # 100,000 runs of examples/tiny_cnn.onnx,
                                                    # 2,000 of ~/kiln-models/mobilenet_v2.onnx
    python scripts/soak.py --model M.onnx:RUNS ...  # other models and counts
    python scripts/soak.py --threads 2 --json out.json

Each model gets a Session (through the Python package, so its conversions are soaked too)
and one fixed input; RSS (/proc/self/statm) is sampled every 1% of the runs. Warm-up is the
first 10% of the runs; the verdict compares the largest RSS after warm-up with the RSS at
the end of warm-up: growth above --tolerance MiB (default 2) is reported as FAIL (exit 1).
"""

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np

import kiln

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULTS = [
    (str(ROOT / "examples" / "tiny_cnn.onnx"), 100_000),
    (str(pathlib.Path.home() / "kiln-models" / "mobilenet_v2.onnx"), 2_000),
]


def rss_mib():
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def feed_for(session):
    rng = np.random.default_rng(0)
    feed = {}
    for name, (shape, dtype) in session.model_input_shape_dict().items():
        dims = [d if isinstance(d, int) else 1 for d in shape]
        dt = np.dtype(dtype)
        if dt.kind == "f":
            feed[name] = rng.standard_normal(dims).astype(dt)
        elif dt.kind in "iu":
            feed[name] = np.zeros(dims, dt)
        else:
            feed[name] = np.zeros(dims, dt)
    return feed


def soak(path, runs, threads):
    s = kiln.Session(path, num_of_cores=threads)
    feed = feed_for(s)
    every = max(1, runs // 100)
    warm = max(1, runs // 10)
    samples = []
    start = time.perf_counter()
    for i in range(1, runs + 1):
        s.run(feed)
        if i % every == 0 or i == warm:
            samples.append((i, rss_mib()))
    elapsed = time.perf_counter() - start
    at_warm = next(r for i, r in samples if i >= warm)
    after = [r for i, r in samples if i > warm]
    peak = max(after) if after else at_warm
    return {
        "model": os.path.basename(path),
        "runs": runs,
        "threads": threads,
        "seconds": round(elapsed, 1),
        "rss_after_warmup_mib": round(at_warm, 2),
        "rss_peak_after_warmup_mib": round(peak, 2),
        "rss_end_mib": round(samples[-1][1], 2),
        "growth_mib": round(peak - at_warm, 2),
        "samples": [(i, round(r, 2)) for i, r in samples],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", default=[], metavar="PATH:RUNS")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tolerance", type=float, default=2.0, help="MiB of growth after warm-up allowed")
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args()
    todo = [(m.rsplit(":", 1)[0], int(m.rsplit(":", 1)[1])) for m in a.model] or DEFAULTS
    results, failed = [], False
    for path, runs in todo:
        if not os.path.exists(path):
            print(f"skip {path}: not found")
            continue
        r = soak(path, runs, a.threads)
        ok = r["growth_mib"] <= a.tolerance
        failed |= not ok
        print(
            f"{r['model']}: {runs} runs in {r['seconds']} s on {a.threads} thread(s); RSS after warm-up "
            f"{r['rss_after_warmup_mib']} MiB, peak after {r['rss_peak_after_warmup_mib']}, end {r['rss_end_mib']} "
            f"(growth {r['growth_mib']} MiB) {'ok' if ok else 'FAIL'}"
        )
        results.append(r)
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(results, indent=1))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
