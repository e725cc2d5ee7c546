#!/usr/bin/env bash
# The test command (README, CI): cargo's tests (unit, CLI, tidy, the ONNX backend suite), then
# the Python package's pytest suite against this checkout installed into the set-up venv.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${KILN_CACHE:-$HOME/.cache/kiln}/venv"
cargo test --workspace --release
"$VENV/bin/pip" install --quiet --disable-pip-version-check .
"$VENV/bin/python" -m pytest -q python/tests
