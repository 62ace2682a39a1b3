#!/usr/bin/env bash
# Set up a development environment in .venv: torch==2.13.0 from pip's configured index (unless a
# torch is already importable in .venv), then dsagen itself (editable) with its test extra.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q "torch==2.13.0"
fi
.venv/bin/python -m pip install -q -e '.[test]'
echo "dsagen set up in .venv: torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'), nvcc: $(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || echo none)"
