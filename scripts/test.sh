#!/usr/bin/env bash
# Install everything into .venv and run the test suite CI runs: every test but those marked slow (run by the
# GPU check; OSTINATO_TEST_SLOW=1 includes them). Fails on any failure, and also when pytest collected no
# tests (its exit code 5).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
# System tools the tests use, from Debian's packages: flatc regenerates the program schema's code to
# prove it is fresh; redis-server backs the cache tests (they start their own on loopback).
missing=()
command -v flatc >/dev/null 2>&1 || missing+=(flatbuffers-compiler)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "test: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null \
    || { echo "test: FAILED: could not install ${missing[*]}; install them and re-run" >&2; exit 1; }
fi
# MLX's tests (the MLX backend, through MLX's CPU build on Linux) run wherever MLX has a wheel: there
# a missing MLX is an install failure, not a reason to skip them.
case "$(uname -s)" in
  Linux|Darwin)
    .venv/bin/python -c 'import mlx.core' \
      || { echo "test: FAILED: MLX does not import; pip install 'mlx[cpu]' (Linux) or 'mlx' (macOS)" >&2; exit 1; }
    export OSTINATO_REQUIRE_MLX=1 ;;
esac
workers=${OSTINATO_TEST_WORKERS:-2}
# CI's run leaves out the tests of tests/slow_tests.txt (marked slow: more than half of the time a full run
# took on 2 cores), which the GPU check runs on the lent machine (scripts/gpu_check.py --slow);
# OSTINATO_TEST_SLOW=1 runs them here too.
select=(-m "not slow")
if [ "${OSTINATO_TEST_SLOW:-0}" = "1" ]; then
  select=()
else
  echo "test: leaving out the tests marked slow (tests/slow_tests.txt; OSTINATO_TEST_SLOW=1 runs them too)"
fi
.venv/bin/python -m pytest -n "$workers" --timeout 900 -q -rfEs "${select[@]}" "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test: FAILED: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
