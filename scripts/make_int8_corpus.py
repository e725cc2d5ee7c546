"""Int8 twins of the real-model corpus (issue 27): each fp32 model of scripts/make_corpus.py's
cache quantized with ONNX Runtime's own tools, as its users quantize: `quant_pre_process`
(shape inference and ORT's graph clean-up; models below opset 13 converted to 13 first, as
per-channel DequantizeLinear needs), then `quantize_static` per-channel, once in QDQ
format and once in QOperator format (com.microsoft QLinear* ops), calibrated (MinMax) on the
model's own inputs and variants of them (flipped images, shifted audio and token windows).

    python scripts/make_corpus.py                      # the fp32 corpus first
    python scripts/make_int8_corpus.py                 # ~/.cache/kiln/corpus -> ~/.cache/kiln/corpus_int8
    python scripts/bench_vs_ort.py --openvino ~/.cache/kiln/corpus_int8/*.int8_*.onnx
    python scripts/int8_accuracy.py ~/.cache/kiln/corpus_int8

Per model it writes <out>/<name>.int8_qdq.onnx and <out>/<name>.int8_qop.onnx, and links
<name>.onnx and <name>.io.npz beside them (the fp32 reference and the inputs the other scripts
read). Models ORT's quantizer cannot take (com.microsoft graphs, control flow it rejects) are
listed at the end and skipped; it is idempotent (--force rebuilds). The cache is never part of
the repository.

Needs numpy, onnx and onnxruntime.

usage: python scripts/make_int8_corpus.py [--corpus DIR] [--out DIR] [--force] [NAME...]
"""
import argparse
import json
import os
import sys
import tempfile
import traceback

import numpy as np
import onnx
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_static)
from onnxruntime.quantization.shape_inference import quant_pre_process

CACHE = os.path.join(os.path.expanduser("~"), ".cache", "kiln")


def variants(feeds, count):
    """The model's feeds and `count - 1` variants of them: float tensors of rank >= 3 flipped
    along their last axis and scaled, rank 2 float tensors (audio) rolled, integer tensors as
    they are (token ids and masks keep their meaning)."""
    out = [feeds]
    rng = np.random.default_rng(0)
    for i in range(1, count):
        v = {}
        for k, a in feeds.items():
            if a.dtype.kind == "f":
                b = a
                if a.ndim >= 3:
                    b = np.flip(a, axis=-1) if i % 2 else np.flip(a, axis=-2)
                elif a.ndim >= 1 and a.shape[-1] > 1:
                    b = np.roll(a, a.shape[-1] // (i + 1), axis=-1)
                b = b * np.float32(1.0 + 0.1 * rng.standard_normal())
                v[k] = np.ascontiguousarray(b, dtype=a.dtype)
            else:
                v[k] = a
        out.append(v)
    return out


class Reader(CalibrationDataReader):
    def __init__(self, samples):
        self.it = iter(samples)

    def get_next(self):
        return next(self.it, None)


def quantize(src, dst, fmt, samples):
    src, dst = os.path.abspath(src), os.path.abspath(dst)
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        # ORT's tools write their temporary files (symbolic shape inference's model, large
        # models' external data) into the working directory: keep them in `tmp`.
        os.chdir(tmp)
        try:
            quantize_in(src, dst, fmt, samples, tmp)
        finally:
            os.chdir(cwd)


def quantize_in(src, dst, fmt, samples, tmp):
    model = onnx.load(src)
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset < 13:
        # Per-channel DequantizeLinear (its `axis`) needs opset 13; ORT's quantizer writes it
        # into older models as they are, which ORT then refuses to load.
        from onnx import version_converter
        src = os.path.join(tmp, "opset13.onnx")
        onnx.save(version_converter.convert_version(model, 13), src)
    pre = os.path.join(tmp, "pre.onnx")
    try:
        quant_pre_process(src, pre, skip_symbolic_shape=False)
    except Exception:
        # Symbolic shape inference fails on some graphs; ORT's docs then skip it.
        quant_pre_process(src, pre, skip_symbolic_shape=True)
    quantize_static(pre, dst + ".part", Reader(samples), quant_format=fmt, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    extra_options={"ActivationSymmetric": False, "WeightSymmetric": True})
    os.replace(dst + ".part", dst)


def link(src, dst):
    if os.path.lexists(dst):
        os.remove(dst)
    os.symlink(os.path.abspath(src), dst)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=os.path.join(CACHE, "corpus"))
    ap.add_argument("--out", default=os.path.join(CACHE, "corpus_int8"))
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--samples", type=int, default=4, help="calibration samples per model")
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    with open(os.path.join(a.corpus, "corpus.json")) as f:
        models = json.load(f)["models"]
    os.makedirs(a.out, exist_ok=True)
    failures = []
    for m in models:
        name = m["name"]
        if a.names and name not in a.names:
            continue
        src = os.path.join(a.corpus, m["file"])
        graph = onnx.load(src, load_external_data=False).graph
        if any(n.domain not in ("", "ai.onnx") for n in graph.node):
            print(f"{name}: skipped (com.microsoft ops: ORT's quantizer takes plain ONNX)")
            continue
        if any(t.data_type == onnx.TensorProto.FLOAT16 for t in graph.initializer):
            print(f"{name}: skipped (float16 weights)")
            continue
        io = np.load(os.path.join(a.corpus, m["io"]))
        feeds = {k[3:]: io[k] for k in io.files if k.startswith("in_")}
        link(src, os.path.join(a.out, name + ".onnx"))
        link(os.path.join(a.corpus, m["io"]), os.path.join(a.out, name + ".io.npz"))
        for tag, fmt in (("qdq", QuantFormat.QDQ), ("qop", QuantFormat.QOperator)):
            dst = os.path.join(a.out, f"{name}.int8_{tag}.onnx")
            if os.path.exists(dst) and not a.force:
                continue
            print(f"{name} {tag}: quantizing", flush=True)
            try:
                quantize(src, dst, fmt, variants(feeds, a.samples))
            except Exception as e:
                traceback.print_exc(limit=2)
                failures.append((f"{name} {tag}", f"{type(e).__name__}: {e}"))
    if failures:
        print("\nfailed:")
        for n, e in failures:
            print(f"  {n}: {e[:200]}")
        sys.exit(1)


if __name__ == "__main__":
    main()
