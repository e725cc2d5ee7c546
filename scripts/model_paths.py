"""Model arguments of the scripts: a model file, a corpus directory (scripts/make_corpus.py) or
its corpus.json."""

import glob
import json
import os


def expand_models(paths):
    """The model paths as given, except that a directory stands for the models its corpus.json
    lists (scripts/make_corpus.py writes one), or else its *.onnx files, and a .json file for the
    models it lists."""
    out = []
    for p in paths:
        if os.path.isdir(p):
            if not os.path.exists(os.path.join(p, "corpus.json")):
                out += sorted(glob.glob(os.path.join(p, "*.onnx")))
                continue
            p = os.path.join(p, "corpus.json")
        if p.endswith(".json"):
            with open(p) as f:
                out += [os.path.join(os.path.dirname(p), m["file"]) for m in json.load(f)["models"]]
        else:
            out.append(p)
    return out
