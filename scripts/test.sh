#!/usr/bin/env bash
# The test command (README, CI): cargo's tests (unit, CLI, tidy, the ONNX backend suite), the
# loom model checks of the thread pool, then the Python package's pytest suite against this
# checkout installed into the set-up venv.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${KILN_CACHE:-$HOME/.cache/kiln}/venv"
cargo test --workspace --release
# The thread pool's hand-off protocol, model-checked by loom (a build of its own).
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p kiln-kernels --test loom_pool --release
"$VENV/bin/pip" install --quiet --disable-pip-version-check .
"$VENV/bin/python" -m pytest -q python/tests
