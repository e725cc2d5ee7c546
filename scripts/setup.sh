#!/usr/bin/env bash
# One-time set-up on a fresh machine: Python tools for reference data (onnx pinned, onnxruntime,
# numpy, pytest) in a venv under ~/.cache/kiln, the ONNX backend test data and the com.microsoft
# op cases (ONNX Runtime outputs) written into the cache, a release build of kiln, and kiln's
# Python package installed into the venv.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${KILN_CACHE:-$HOME/.cache/kiln}"
VENV="$CACHE/venv"
ONNX_VERSION="${KILN_ONNX_VERSION:-1.23.2}"
mkdir -p "$CACHE"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# ml_dtypes generates the node cases' expected outputs: 0.7 turned out-of-range float -> int4
# and int2 casts into 0 where earlier versions wrap (test_cast_FLOAT_to_INT4 and 23 others),
# so the data, and the expected-failures list, are those of 0.6.
"$VENV/bin/pip" install --quiet --disable-pip-version-check numpy "onnx==$ONNX_VERSION" onnxruntime pytest "ml_dtypes>=0.5,<0.7"
DATA="${KILN_ONNX_TESTS:-$CACHE/onnx-tests}"
ML_DTYPES="$("$VENV/bin/python" -c 'import ml_dtypes; print(ml_dtypes.__version__)')"
if [ "$(cat "$DATA/onnx_version.txt" 2>/dev/null)" != "$ONNX_VERSION ml_dtypes $ML_DTYPES" ]; then
  rm -rf "$DATA"
  "$VENV/bin/python" scripts/fetch_onnx_tests.py "$DATA"
fi
# com.microsoft op cases, ONNX Runtime's outputs as the reference; rewritten when the script changes.
STAMP="$(sha256sum scripts/make_contrib_tests.py | cut -c1-16)"
if [ "$(cat "$DATA/contrib.stamp" 2>/dev/null)" != "$STAMP" ]; then
  "$VENV/bin/python" scripts/make_contrib_tests.py "$DATA"
  echo "$STAMP" > "$DATA/contrib.stamp"
fi
cargo build --release --quiet -p kiln-cli -p kiln-conformance
# The Python package (import kiln), built by maturin from this checkout.
"$VENV/bin/pip" install --quiet --disable-pip-version-check .
echo "set-up done: test data in $DATA, binaries in target/release, the kiln Python package in $VENV"
