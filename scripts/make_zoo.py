"""Fourteen more ONNX models to measure kiln on, beyond ../shared/bench: model families whose operators
the benchmark set does not exercise (grouped convolution, squeeze-excitation, pre-activation
BatchNorm with channel Concats, channel shuffles with Slice, fire modules, Inception's average
pools, Swin's shifted windows (strided Slice, Pad), GPT-2's QKV Split, ...). Random weights (no download: torchvision's and transformers' constructors only), batch 1,
opset 17, legacy exporter, like the benchmark set.

usage: python scripts/make_zoo.py --out DIR [NAME...]
Then e.g.: python scripts/bench_vs_ort.py DIR/*.onnx, python scripts/compare_ort.py --via-program DIR/*.onnx
(text models also get DIR/<name>.io.npz with their input_ids, read by bench_vs_ort.py).
"""
import argparse
import os

import numpy as np
import torch
import torchvision
import transformers

M = torchvision.models
VISION = {
    "resnext50_32x4d": M.resnext50_32x4d,
    "regnet_y_800mf": M.regnet_y_800mf,
    "densenet121": M.densenet121,
    "shufflenet_v2": M.shufflenet_v2_x1_0,
    "efficientnet_b0": M.efficientnet_b0,
    "mobilenet_v3_large": M.mobilenet_v3_large,
    "convnext_tiny": M.convnext_tiny,
    "squeezenet1_1": M.squeezenet1_1,
    "inception_v3": lambda: M.inception_v3(aux_logits=False, init_weights=True),
    "googlenet": lambda: M.googlenet(aux_logits=False, init_weights=True),
    "mnasnet1_0": M.mnasnet1_0,
    "swin_t": M.swin_t,
}
# Input sizes other than 224.
SIZE = {"inception_v3": 299}
TEXT = {
    "gpt2": (transformers.GPT2Config, transformers.GPT2Model),
    "distilbert": (transformers.DistilBertConfig, transformers.DistilBertModel),
}


class LastHidden(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids):
        return self.m(input_ids=input_ids).last_hidden_state


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    names = a.names or list(VISION) + list(TEXT)
    for name in names:
        torch.manual_seed(0)
        path = os.path.join(a.out, name + ".onnx")
        if name in VISION:
            m = VISION[name]().eval()
            size = SIZE.get(name, 224)
            x = torch.randn(1, 3, size, size)
            torch.onnx.export(m, x, path, opset_version=17, input_names=["x"], output_names=["y"], dynamo=False)
        elif name in TEXT:
            cfg, cls = TEXT[name]
            m = LastHidden(cls(cfg()).eval())
            ids = torch.randint(0, 1000, (1, 128))
            torch.onnx.export(m, (ids,), path, opset_version=17, input_names=["input_ids"], output_names=["y"],
                              dynamo=False)
            np.savez(os.path.join(a.out, name + ".io.npz"), in_input_ids=ids.numpy())
        else:
            raise SystemExit(f"unknown model {name}; known: {', '.join(list(VISION) + list(TEXT))}")
        print(name, "->", path, flush=True)


if __name__ == "__main__":
    main()
