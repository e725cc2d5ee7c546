#!/usr/bin/env python3
"""Turns photos into calibration data for `kiln compile --calibration-data DIR`.

Writes one .npz per sample into OUT, its one array named after the model's (first) image input.
Preprocessing, in this order and stated in OUT/preprocessing.json:
  1. the photo as RGB (or BGR with --bgr) float32 in [0, 255];
  2. a square-ish crop (centre, then the four corners, then their mirror images: more samples
     from few photos), resized bilinearly to HxW (taken from the model's input when static,
     else --size);
  3. x * --scale (default 1/255), then (x - mean) / std per channel (--mean, --std; ImageNet's
     by default, --mean 0,0,0 --std 1,1,1 for none);
  4. laid out NCHW (default) or NHWC (--layout), a leading batch axis of 1.

Photos: every .png/.jpg/.jpeg/.bmp in --images, else the colour photos scikit-image ships
(skimage.data). Needs numpy, onnx, and scikit-image (or Pillow) to read and resize.

  python scripts/make_calibration.py model.onnx OUT --count 16
  python scripts/make_calibration.py model.onnx OUT --size 48x192 --mean 0.5,0.5,0.5 --std 0.5,0.5,0.5
"""

import argparse
import json
import os
import sys

import numpy as np

SKIMAGE_PHOTOS = ["astronaut", "coffee", "chelsea", "rocket", "cat", "immunohistochemistry", "retina", "motorcycle_left",
                  "hubble_deep_field", "colorwheel"]


def photos(folder):
    if folder:
        from skimage import io
        names = sorted(n for n in os.listdir(folder) if n.lower().endswith((".png", ".jpg", ".jpeg", ".bmp")))
        for n in names:
            img = io.imread(os.path.join(folder, n))
            yield n, img
        return
    from skimage import data
    for n in SKIMAGE_PHOTOS:
        f = getattr(data, n, None)
        if f is None:
            continue
        try:
            img = f()
        except Exception as e:  # a photo that needs a download (pooch) the machine cannot make
            print(f"skipping skimage.data.{n}: {e}", file=sys.stderr)
            continue
        if isinstance(img, tuple):
            img = img[0]
        yield n, img


def rgb(img):
    img = np.asarray(img)
    if img.ndim == 2:
        img = np.stack([img] * 3, axis=-1)
    if img.shape[-1] == 4:
        img = img[..., :3]
    img = img.astype(np.float32)
    if img.max() <= 1.0:
        img = img * 255.0
    return img


def crops(img, h, w):
    """Centre, four corners, then the same mirrored: each the largest crop of the target's aspect."""
    H, W = img.shape[:2]
    aspect = w / h
    ch, cw = (H, int(H * aspect)) if H * aspect <= W else (int(W / aspect), W)
    ch, cw = max(1, int(ch * 0.9)), max(1, int(cw * 0.9))
    spots = [((H - ch) // 2, (W - cw) // 2), (0, 0), (0, W - cw), (H - ch, 0), (H - ch, W - cw)]
    out = [img[y:y + ch, x:x + cw] for y, x in spots]
    return out + [c[:, ::-1] for c in out]


def resize(img, h, w):
    from skimage.transform import resize as sk_resize
    return sk_resize(img, (h, w), order=1, preserve_range=True, anti_aliasing=True).astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--images", help="folder of photos (default: scikit-image's)")
    ap.add_argument("--count", type=int, default=16)
    ap.add_argument("--skip", type=int, default=0, help="skip this many samples first (evaluation sets apart)")
    ap.add_argument("--size", help="HxW when the model's input dims are symbolic")
    ap.add_argument("--layout", choices=["NCHW", "NHWC"], default="NCHW")
    ap.add_argument("--scale", type=float, default=1 / 255)
    ap.add_argument("--mean", default="0.485,0.456,0.406")
    ap.add_argument("--std", default="0.229,0.224,0.225")
    ap.add_argument("--bgr", action="store_true")
    ap.add_argument("--input", help="the input's name (default: the model's first)")
    a = ap.parse_args()

    import onnx
    m = onnx.load(a.model, load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    inputs = [i for i in m.graph.input if i.name not in inits]
    inp = next((i for i in inputs if i.name == a.input), inputs[0]) if a.input else inputs[0]
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
            for d in inp.type.tensor_type.shape.dim]
    if len(dims) != 4:
        sys.exit(f"input {inp.name} has rank {len(dims)}: this script makes images (rank 4)")
    h, w = (dims[2], dims[3]) if a.layout == "NCHW" else (dims[1], dims[2])
    if a.size:
        h, w = (int(v) for v in a.size.lower().split("x"))
    if not h or not w:
        sys.exit(f"input {inp.name} has symbolic height/width: pass --size HxW")
    mean = np.array([float(v) for v in a.mean.split(",")], np.float32)
    std = np.array([float(v) for v in a.std.split(",")], np.float32)

    os.makedirs(a.out, exist_ok=True)
    made = seen = 0
    sources = []
    for name, img in photos(a.images):
        for k, c in enumerate(crops(rgb(img), h, w)):
            if made >= a.count:
                break
            seen += 1
            if seen <= a.skip:
                continue
            x = resize(c, h, w)
            if a.bgr:
                x = x[..., ::-1]
            x = (x * a.scale - mean) / std
            x = x.transpose(2, 0, 1) if a.layout == "NCHW" else x
            x = np.ascontiguousarray(x[None].astype(np.float32))
            np.savez(os.path.join(a.out, f"sample_{made:04d}.npz"), **{inp.name: x})
            sources.append(f"{name} crop {k}")
            made += 1
    if made == 0:
        sys.exit("no samples made (no photos?)")
    with open(os.path.join(a.out, "preprocessing.json"), "w") as f:
        json.dump({"input": inp.name, "height": h, "width": w, "layout": a.layout, "scale": a.scale,
                   "mean": mean.tolist(), "std": std.tolist(), "bgr": a.bgr, "skip": a.skip, "samples": sources}, f,
                  indent=1)
    print(f"{made} samples of {inp.name} [1, {'3, %d, %d' % (h, w) if a.layout == 'NCHW' else '%d, %d, 3' % (h, w)}] "
          f"in {a.out}")


if __name__ == "__main__":
    main()
