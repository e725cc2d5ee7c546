#!/usr/bin/env python3
"""kiln's own quantization against ONNX Runtime's, as issue 29 judges it.

For one fp32 model, calibration samples and evaluation samples (folders of one-sample .npz
files, e.g. from scripts/make_calibration.py): ONNX Runtime's quantize_static (QDQ,
per_channel=True, reduce_range=False, s8 symmetric weights, u8 asymmetric activations) with
MinMax, Entropy and Percentile, and kiln's convert_to_quantize with each of its six
calibration methods (enable_channelwise, enable_rowwise, asymmetric activations: the same
granularity). Prints the mean SQNR (dB) of the outputs against the fp32 model's (run by ONNX
Runtime) over the evaluation samples, and the two bars: kiln MinMax >= ORT MinMax - 0.5,
kiln's best >= ORT's best - 0.5.

    python scripts/quant_accuracy.py model.onnx CALIB_DIR EVAL_DIR [--kiln target/release/kiln]
"""

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import onnxruntime as ort


def sqnr(ref, got):
    ref = np.asarray(ref, np.float64)
    got = np.asarray(got, np.float64)
    noise = np.sum((ref - got) ** 2)
    if noise == 0:
        return float("inf")
    return 10 * np.log10(np.sum(ref ** 2) / noise)


def samples(folder):
    return [dict(np.load(f)) for f in sorted(glob.glob(os.path.join(folder, "*.npz")))]


class Reader:
    def __init__(self, data):
        self.data = iter(data)

    def get_next(self):
        return next(self.data, None)


def ort_quantized(model, calib, method, out):
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    m = {"MinMax": CalibrationMethod.MinMax, "Entropy": CalibrationMethod.Entropy,
         "Percentile": CalibrationMethod.Percentile}[method]
    quantize_static(model, out, Reader(calib), quant_format=QuantFormat.QDQ, per_channel=True, reduce_range=False,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, calibrate_method=m)
    return out


def run_ort(path, feeds):
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    return [dict(zip(names, s.run(None, f))) for f in feeds]


def run_kiln(kiln, program, feed_dir):
    outs = []
    with tempfile.TemporaryDirectory() as d:
        for f in sorted(glob.glob(os.path.join(feed_dir, "*.npz"))):
            od = os.path.join(d, os.path.basename(f))
            subprocess.run([kiln, "run", program, "--inputs", f, "-o", od], check=True, capture_output=True)
            outs.append({os.path.basename(p)[:-4]: np.load(p) for p in glob.glob(os.path.join(od, "*.npy"))})
    return outs


def file_name(name):
    """The file kiln run writes an output to: anything but letters, digits, '.', '_', '-' is '_'."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def mean_sqnr(ref, got):
    vals = []
    for r, g in zip(ref, got):
        for name, x in r.items():
            y = g.get(name, g.get(file_name(name)))
            if x.dtype.kind == "f" and y is not None:
                vals.append(sqnr(x, y))
    return float(np.mean(vals))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("calib")
    ap.add_argument("eval")
    ap.add_argument("--kiln", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "kiln"))
    ap.add_argument("--methods", default="None,KLMinimization,KLMinimizationV2,Percentile,MSE,SQNR")
    ap.add_argument("--ort-methods", default="MinMax,Entropy,Percentile")
    ap.add_argument("--schema", default="asymmetric", help="kiln's quantization_schema_activations")
    a = ap.parse_args()

    calib = samples(a.calib)
    evals = samples(a.eval)
    ref = run_ort(a.model, evals)
    results = {}
    with tempfile.TemporaryDirectory() as d:
        for m in a.ort_methods.split(","):
            try:
                q = ort_quantized(a.model, calib, m, os.path.join(d, f"ort_{m}.onnx"))
                results[f"ORT {m}"] = mean_sqnr(ref, run_ort(q, evals))
            except Exception as e:  # ORT's Entropy/Percentile fail on some graphs
                print(f"ORT {m}: {e}", file=sys.stderr)
        for m in a.methods.split(","):
            prog = os.path.join(d, f"kiln_{m}.kiln")
            opts = ["-O", "convert_to_quantize=true", "-O", f"quantization_calibration={m}", "-O",
                    "enable_channelwise=true", "-O", "enable_rowwise=true", "-O",
                    f"quantization_schema_activations={a.schema}"]
            if m == "Percentile":
                opts += ["-O", "percentile_calibration_value=99.999"]
            subprocess.run([a.kiln, "compile", a.model, "-o", prog, "-q", "--calibration-data", a.calib] + opts,
                           check=True)
            results[f"kiln {m}"] = mean_sqnr(ref, run_kiln(a.kiln, prog, a.eval))
    for k, v in results.items():
        print(f"{k:<24} {v:7.2f} dB")
    ort_best = max((v for k, v in results.items() if k.startswith("ORT")), default=None)
    kiln_best = max((v for k, v in results.items() if k.startswith("kiln")), default=None)
    if "ORT MinMax" in results and "kiln None" in results:
        d = results["kiln None"] - results["ORT MinMax"]
        print(f"MinMax: kiln - ORT = {d:+.2f} dB ({'ok' if d >= -0.5 else 'BELOW the bar'})")
    if ort_best is not None and kiln_best is not None:
        d = kiln_best - ort_best
        print(f"best:   kiln - ORT = {d:+.2f} dB ({'ok' if d >= -0.5 else 'BELOW the bar'})")


if __name__ == "__main__":
    main()
