#!/usr/bin/env bash
# Create .venv and install ostinato with everything its demo and tests need. Idempotent: a second run
# with an unchanged pyproject.toml does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "ostinato needs Python >= 3.11; set PYTHON=python3.11")'
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.ostinato-setup
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing into .venv (torch, transformers, pytest, ...)"
  # torch first and pinned: 2.13.0 is the CPU build this project's machines carry; other versions
  # from 2.11 on work too (pyproject.toml's range).
  .venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
  # The benchmark suite's ExecuTorch runner (bench/suite/peers.py), in a directory of its own that only
  # that runner puts on sys.path: executorch needs torchao, and with torchao importable transformers
  # imports it whenever it builds a model (8 s, and a CUDA library that fails to load on this CPU torch).
  # executorch's wheel names no torch version (it runs with 2.13); its dependency list pulls coremltools,
  # scikit-learn, pandas, hydra and more that its export-lower-run path never imports: installed without
  # them (--no-deps), with the two that path does import (ruamel.yaml, tabulate) and the torchao its wheel
  # pins. torch is left as it is.
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --upgrade --target .venv/executorch-peer \
    "executorch==1.5.1" "torchao==0.18.0" "ruamel.yaml==0.19.1" "tabulate==0.10.0"
  case "$(uname -s)" in Linux|Darwin) mods="ostinato, torch, transformers, pytest, mlx.core" ;; *) mods="ostinato, torch, transformers, pytest" ;; esac
  .venv/bin/python -c "import $mods" \
    || { echo "setup: FAILED: the packages did not import after install" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
