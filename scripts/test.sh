#!/usr/bin/env bash
# Install everything into .venv and run the whole test suite. Fails on any failure, and also when
# pytest collected no tests (its exit code 5).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
# System tools the tests use: flatc regenerates the program schema's code to prove it is fresh.
if ! command -v flatc >/dev/null 2>&1; then
  echo "test: installing Debian's flatbuffers-compiler (flatc)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq flatbuffers-compiler >/dev/null \
    || { echo "test: FAILED: could not install flatbuffers-compiler (flatc); install it and re-run" >&2; exit 1; }
fi
workers=${OSTINATO_TEST_WORKERS:-2}
.venv/bin/python -m pytest -n "$workers" --timeout 900 -q -rfEs "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test: FAILED: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
