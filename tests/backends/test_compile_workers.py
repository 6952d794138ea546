"""Cold kernel compiles in worker processes (backends/cuda/compile_workers.py): the same cubins as an
in-process compile, several at once, cached as they arrive, errors named, a dead worker survived; and
the op-level fallback to the reference while a kernel compiles (runtime.deferring). No GPU needed: the
workers compile for sm_90."""
from __future__ import annotations

import os
import random
import threading
import time

import pytest

pytest.importorskip("triton")

import ostinato.cache as oc  # noqa: E402
from ostinato.cache.service import set_cache  # noqa: E402
from ostinato.backends.cuda import binaries, compile_workers  # noqa: E402
from ostinato.backends.cuda.binaries import binary_key, compile_binary, register_source, submit_binary  # noqa: E402
from ostinato.backends.cuda.runtime import CompilePending, _op_scope, awaiting_compiles, deferring  # noqa: E402
from ostinato.errors import BackendError  # noqa: E402

NORM_TYPES = ["*fp16:D", "*fp16:D", "*fp16:D", "i32", "fp32", "fp32"]


def _norm_flags(block: int) -> dict:
    return {"HAS_WEIGHT": True, "UPCAST": True, "W_FIRST": False, "BLOCK": block, "num_warps": 4}


def _generated(scale: float) -> str:
    """A generated module (registered, never imported by the parent before its compile)."""
    text = f'''import triton
import triton.language as tl


@triton.jit
def k(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    tl.store(out_ptr + offs, x * {scale!r} + 1.0, mask=m)
'''
    module = f"gen_test_scale_{str(scale).replace('.', '_').replace('-', 'm')}"
    register_source(module, text)
    return module


@pytest.fixture
def workers(monkeypatch, tmp_path):
    monkeypatch.setenv("OSTINATO_COMPILE_WORKERS", "2")
    monkeypatch.setenv("OSTINATO_CACHE_DIR", str(tmp_path / "cache"))
    set_cache(None)
    monkeypatch.setattr(compile_workers, "_POOL", None)
    yield
    if compile_workers._POOL is not None:
        compile_workers._POOL.wait(timeout=120)
    set_cache(None)


def test_worker_cubins_equal_in_process_ones_and_reach_the_cache(workers):
    blocks = random.sample([64, 128, 256, 512, 1024], 3)
    futures = [submit_binary("norms", "rms_norm_kernel", NORM_TYPES, _norm_flags(b), 90) for b in blocks]
    scale = round(random.uniform(0.5, 3.0), 3)
    module = _generated(scale)
    futures.append(submit_binary(module, "k", ["*fp32:D", "*fp32:D", "i32"], {"BLOCK": 256}, 90))
    assert all(f is not None for f in futures)
    got = [f.result(timeout=300) for f in futures]
    for (meta, cubin, seconds), block in zip(got[:3], blocks):
        want_meta, want = compile_binary("norms", "rms_norm_kernel", NORM_TYPES, _norm_flags(block), 90)
        assert meta == want_meta and cubin == want and seconds > 0
    meta, cubin, _ = got[3]
    assert (meta, cubin) == compile_binary(module, "k", ["*fp32:D", "*fp32:D", "i32"], {"BLOCK": 256}, 90)
    # every result was put in the cache tiers on arrival: the next lookup is a hit
    for block in blocks:
        assert binaries.cached_binary("norms", "rms_norm_kernel", NORM_TYPES, _norm_flags(block), 90) is not None
    key = binary_key(module, "k", ["*fp32:D", "*fp32:D", "i32"], {"BLOCK": 256}, 90)
    assert oc.get_cache().get(key) is not None


def test_one_compile_per_key_and_two_workers_at_once(workers):
    flags = _norm_flags(random.choice([128, 256]))
    a = submit_binary("norms", "rms_norm_kernel", NORM_TYPES, flags, 90)
    b = submit_binary("norms", "rms_norm_kernel", NORM_TYPES, flags, 90)
    assert a is b        # a second asker of the same binary waits on the first's compile
    others = [submit_binary("norms", "rms_norm_kernel", NORM_TYPES[:3] + [t, "fp32", "fp32"], flags, 90)
              for t in ("i32:D", "i64")]
    for f in [a, *others]:
        f.result(timeout=300)
    pool = compile_workers._POOL
    assert pool is not None and 1 <= len(pool._threads) <= 2


def test_a_kernel_that_does_not_compile_is_named(workers):
    fut = submit_binary("norms", "rms_norm_kernel", ["*fp32:D"] * 3, _norm_flags(64), 90)
    with pytest.raises(BackendError, match=r"rms_norm_kernel takes 6 runtime arguments"):
        fut.result(timeout=300)
    bad = "gen_test_broken"
    register_source(bad, "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
                         "def k(x_ptr, BLOCK: tl.constexpr):\n    tl.store(x_ptr + tl.arange(0, BLOCK), undefined_name)\n")
    with pytest.raises(BackendError, match=r"Triton kernel k \[BLOCK=64\] for sm_90 failed to compile"):
        submit_binary(bad, "k", ["*fp32:D"], {"BLOCK": 64}, 90).result(timeout=300)


def test_a_dead_worker_fails_its_request_and_the_next_one_starts_afresh(workers):
    pool = compile_workers.pool()
    first = pool.submit({"path": binaries.source_path("norms"), "kernel": "rms_norm_kernel",
                         "arg_types": NORM_TYPES, "constexprs": _norm_flags(64), "arch": 90})
    head, cubin = first.result(timeout=300)
    assert head["ok"] and len(cubin) == head["nbytes"] > 1000
    # kill the worker that served it: its thread notices on the next request
    procs = [p for p in _worker_processes()]
    assert procs, "no worker process found"
    for p in procs:
        p.kill()
        p.wait()
    again = pool.submit({"path": binaries.source_path("norms"), "kernel": "rms_norm_kernel",
                         "arg_types": NORM_TYPES, "constexprs": _norm_flags(128), "arch": 90})
    with pytest.raises(compile_workers.WorkerDied):
        again.result(timeout=300)
    third = pool.submit({"path": binaries.source_path("norms"), "kernel": "rms_norm_kernel",
                         "arg_types": NORM_TYPES, "constexprs": _norm_flags(128), "arch": 90})
    assert third.result(timeout=300)[0]["ok"]


def _worker_processes():
    import gc
    import subprocess
    return [o for o in gc.get_objects() if isinstance(o, subprocess.Popen)
            and o.args and str(o.args[-1]).endswith("triton_compile.py") and o.poll() is None]


def test_no_workers_means_in_process(monkeypatch):
    monkeypatch.setenv("OSTINATO_COMPILE_WORKERS", "0")
    assert compile_workers.worker_count() == 0
    assert submit_binary("norms", "rms_norm_kernel", NORM_TYPES, _norm_flags(64), 90) is None
    monkeypatch.setenv("OSTINATO_COMPILE_WORKERS", "3")
    assert compile_workers.worker_count() == 3


def test_deferring_runs_the_reference_only_before_any_launch():
    calls = []

    def reference(x, pending_after=None):
        calls.append("reference")
        return x + 1

    def launcher(x, pending_after=None):
        # a launcher of two kernels: the second may be pending after the first launched
        if pending_after == 0 and _op_scope.deferrable:
            raise CompilePending("k0")
        _op_scope.deferrable = False        # what Kernel.__call__ does after a launch
        if pending_after == 1 and _op_scope.deferrable:
            raise CompilePending("k1")     # never: the op already launched a kernel
        calls.append("kernel")
        return x + 1

    run = deferring(launcher, reference)
    x = random.randint(0, 100)
    assert run(x, pending_after=0) == x + 1 and calls == ["reference"]
    assert run(x, pending_after=1) == x + 1 and calls == ["reference", "kernel"]
    assert not _op_scope.deferrable
    calls.clear()
    with awaiting_compiles():     # before a capture: never the reference
        assert run(x, pending_after=0) == x + 1 and calls == ["kernel"]
    assert run(x, pending_after=0) == x + 1 and calls == ["kernel", "reference"]


def test_threads_each_have_their_own_scope():
    seen = {}

    def launcher(name):
        time.sleep(0.01)
        seen[name] = _op_scope.deferrable
        _op_scope.deferrable = False
        return name

    run = deferring(launcher, lambda name: name)
    blocked = threading.Thread(target=lambda: _in_awaiting(run, "awaiting"))
    blocked.start()
    run("free")
    blocked.join()
    assert seen == {"awaiting": False, "free": True}


def _in_awaiting(run, name):
    with awaiting_compiles():
        run(name)


def test_worker_script_imports_no_torch():
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(binaries.__file__), "triton_compile.py")
    code = (f"import runpy, sys; sys.argv=['x']; m = runpy.run_path({script!r}, run_name='not_main'); "
            "print('torch' in sys.modules, 'ostinato' in sys.modules)")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_a_worker_that_cannot_start_is_a_dead_worker(workers, monkeypatch):
    monkeypatch.setattr(compile_workers, "_SCRIPT", "/nonexistent/ostinato-worker.py")
    monkeypatch.setattr(compile_workers.sys, "executable", "/nonexistent/python")
    fut = compile_workers.pool().submit({"path": binaries.source_path("norms"), "kernel": "rms_norm_kernel",
                                         "arg_types": NORM_TYPES, "constexprs": _norm_flags(64), "arch": 90})
    with pytest.raises(compile_workers.WorkerDied, match="no compile worker could start"):
        fut.result(timeout=60)


def test_a_worker_whose_parent_has_gone_exits_quietly():
    """The parent stops reading (it exited, or gave up): the worker ends without a traceback."""
    import subprocess
    import sys
    from ostinato.backends.cuda import triton_compile
    p = subprocess.Popen([sys.executable, triton_compile.__file__], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()                      # nobody will read the answer
    p.stdin.write(b'{"path": "/nonexistent.py", "kernel": "k"}\n')
    p.stdin.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 0 and "BrokenPipe" not in err and "Traceback" not in err, err
