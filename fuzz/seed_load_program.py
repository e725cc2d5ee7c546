#!/usr/bin/env python3
"""Seeds for the load_program fuzz target: the program section of every ONNX backend
node-test model kiln compiles with at most 4 KiB of weights (the target's weights section is
4 KiB of zeros), one file each in ~/.cache/kiln/fuzz/load_program_seeds.

    python fuzz/seed_load_program.py [path/to/kiln]
"""

import glob
import os
import struct
import subprocess
import sys
import tempfile

KILN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "target", "release", "kiln")
OUT = os.path.expanduser("~/.cache/kiln/fuzz/load_program_seeds")
HEADER, ENTRY = 64, 32  # the program file's header and section-table entry sizes


def sections(b):
    count = struct.unpack_from("<I", b, 12)[0]
    out = {}
    for k in range(count):
        e = HEADER + ENTRY * k
        name = b[e:e + 12].rstrip(b"\0").decode()
        out[name] = struct.unpack_from("<QQ", b, e + 16)
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    models = sorted(glob.glob(os.path.expanduser("~/.cache/kiln/onnx-tests/**/model.onnx"), recursive=True))
    n = 0
    with tempfile.TemporaryDirectory() as d:
        prog = os.path.join(d, "seed.kiln")
        for m in models:
            if os.path.getsize(m) > 20000:
                continue
            if subprocess.run([KILN, "compile", m, "-o", prog, "-q"], capture_output=True).returncode != 0:
                continue
            b = open(prog, "rb").read()
            s = sections(b)
            if "program" not in s or s.get("weights", (0, 0))[1] > 4096:
                continue
            off, ln = s["program"]
            with open(os.path.join(OUT, f"seed_{n:04d}"), "wb") as f:
                f.write(b[off:off + ln])
            n += 1
    print(f"{n} seeds in {OUT}")


if __name__ == "__main__":
    main()
