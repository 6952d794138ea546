#!/usr/bin/env bash
# Install everything into .venv and run the demo: a 64-layer tiny decoder exported, compiled and run
# on the CPU with ostinato, checked against eager PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/demo.py "$@"
