"""Time each model as exported (its symbolic and unnamed input dims open) against the same model
with every input dim bound to the shape of the inputs it is fed, with `kiln bench`, to check
that dynamic dims keep the fast paths (issue 26: within 5% after the first inference of a shape).

The bound twin is written to a temporary folder: the ONNX file with each graph input's dims set
to its feed's shape (nothing else changes). Inputs come from `<model>.feeds.npz` (as
scripts/make_corpus.py writes them). Each round times the unbound model, then the bound one
(`kiln bench --json`, median latency after kiln's warm-up); the ratio per model is the median of
the rounds' ratios. Models whose inputs are all static are skipped.

usage: python scripts/bound_vs_unbound.py [--kiln target/release/kiln] [--threads 1] [--rounds 3]
       [--runs 20] MODEL.onnx|DIR|corpus.json...
Exit status 1 when a model's unbound/bound ratio exceeds --limit (default 1.05).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np
import onnx

from model_paths import expand_models


def bound_copy(path, feeds, out_dir):
    """The model with its graph inputs' dims set to the feeds' shapes, or None when static."""
    m = onnx.load(path, load_external_data=False)
    changed = False
    for vi in m.graph.input:
        if vi.name not in feeds or not vi.type.HasField("tensor_type"):
            continue
        shape = feeds[vi.name].shape
        dims = vi.type.tensor_type.shape.dim
        if len(dims) != len(shape):
            continue
        for d, n in zip(dims, shape):
            if not d.HasField("dim_value") or d.dim_value <= 0:
                d.Clear()
                d.dim_value = int(n)
                changed = True
    if not changed:
        return None
    out = os.path.join(out_dir, os.path.basename(path))
    if os.path.dirname(os.path.abspath(path)) == os.path.abspath(out_dir):
        raise SystemExit("the temporary folder is the model's own")
    # External data stays beside the original: point the copy's tensors at it.
    base = os.path.dirname(os.path.abspath(path))
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location" and not os.path.isabs(e.value):
                e.value = os.path.join(base, e.value)
    onnx.save(m, out)
    return out


def bench(kiln, model, feeds_path, threads, runs):
    cmd = [kiln, "bench", model, "--inputs", feeds_path, "-n", str(runs), "--json", "-O",
           f"num_of_cores={threads}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "kiln bench failed")
    return json.loads(r.stdout)["latency_ms"]["p50"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln", default="target/release/kiln")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=20, help="timed inferences per round and model")
    ap.add_argument("--limit", type=float, default=1.05)
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    rows, failed = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for path in expand_models(a.models):
            name = os.path.basename(path)[:-5]
            feeds_path = path[:-5] + ".feeds.npz"
            if not os.path.exists(feeds_path):
                print(f"{name}: no {os.path.basename(feeds_path)}, skipped", flush=True)
                continue
            feeds = dict(np.load(feeds_path))
            try:
                bound = bound_copy(path, feeds, tmp)
                if bound is None:
                    continue
                ratios, ub, bd = [], [], []
                for _ in range(a.rounds):
                    u = bench(a.kiln, path, feeds_path, a.threads, a.runs)
                    b = bench(a.kiln, bound, feeds_path, a.threads, a.runs)
                    ub.append(u)
                    bd.append(b)
                    ratios.append(u / b)
                r = statistics.median(ratios)
                rows.append((name, statistics.median(ub), statistics.median(bd), r))
                flag = "  <-- over" if r > a.limit else ""
                print(f"{name:<28} unbound {statistics.median(ub):9.3f} ms  bound {statistics.median(bd):9.3f} ms"
                      f"  ratio {r:5.3f}{flag}", flush=True)
            except Exception as e:  # keep going: report at the end
                failed.append((name, str(e)))
                print(f"{name}: FAILED {e}", flush=True)
    if rows:
        g = math.exp(sum(math.log(r[3]) for r in rows) / len(rows))
        over = [r[0] for r in rows if r[3] > a.limit]
        print(f"\n{len(rows)} models with dynamic inputs; geometric mean unbound/bound {g:.3f} "
              f"({a.threads} thread(s), median of {a.rounds} rounds; shared, noisy machine); "
              f"over {a.limit}: {', '.join(over) or 'none'}")
    for n, e in failed:
        print(f"FAILED {n}: {e}")
    return 1 if failed or any(r[3] > a.limit for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
