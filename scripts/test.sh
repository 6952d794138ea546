#!/usr/bin/env bash
# Install everything into .venv and run the whole test suite. Fails on any failure, and also when
# pytest collected no tests (its exit code 5).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
workers=${OSTINATO_TEST_WORKERS:-2}
.venv/bin/python -m pytest -n "$workers" --timeout 900 -q -rfEs "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test: FAILED: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
