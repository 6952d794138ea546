"""What a warm start's weight upload costs, piece by piece, each in a fresh process (first-use costs are
the point): pinned buffers' allocation, the device buffer's, a stream's, and the whole upload of a mapped
file (backends/cuda/upload.py) at several sizes, chunk sizes and buffer counts, against a plain
``tensor.to("cuda")`` of the mapping.

  python bench/upload_probe.py --out upload_probe.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MB = 1 << 20


def child(kind: str, path: str, nbytes: int, chunk_mb: int, buffers: int) -> dict:
    import mmap
    import torch
    torch.cuda.init()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    out: dict = {"kind": kind, "nbytes": nbytes, "chunk_mb": chunk_mb, "buffers": buffers}
    if kind == "pinned":
        times = []
        for _ in range(buffers):
            t0 = time.perf_counter()
            torch.empty(chunk_mb * MB, dtype=torch.uint8, pin_memory=True)
            times.append(time.perf_counter() - t0)
        out["pinned_alloc_s"] = times
        return out
    if kind == "parts":
        t0 = time.perf_counter()
        torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        out["device_alloc_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        torch.cuda.Stream()
        out["stream_s"] = time.perf_counter() - t0
        return out
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    src = torch.frombuffer(mapped, dtype=torch.uint8, count=nbytes)
    if kind.startswith("steps"):
        return dict(out, **_steps(kind, mapped, src, path, chunk_mb * MB, buffers))
    t0 = time.perf_counter()
    if kind == "to":
        dst = src.to("cuda")
        torch.cuda.synchronize()
    else:
        sys.path.insert(0, os.path.join(ROOT, "src"))
        from ostinato.backends.cuda import upload
        upload.CHUNK_BYTES, upload.BUFFERS = chunk_mb * MB, buffers
        upload.MIN_PIPELINED_BYTES = 0
        dst = upload.upload(src, torch.device("cuda"))
    out["upload_s"] = time.perf_counter() - t0
    out["gb_per_s"] = nbytes / out["upload_s"] / 1e9
    out["ok"] = bool(torch.equal(dst[-4096:].cpu(), src[-4096:]))
    return out


def _steps(kind: str, mapped, src, path: str, chunk: int, nbuf: int) -> dict:
    """The pipelined upload with its parts timed: CPU copies into the pinned buffers (by ATen over its
    threads; "steps-1thread" on one thread; "steps-populate" after MADV_POPULATE_READ of the mapping;
    "steps-pread" reading the file into the buffers instead of copying from the mapping)."""
    import torch
    n = src.numel()
    t = {"alloc_s": 0.0, "fill_s": 0.0, "wait_s": 0.0, "populate_s": 0.0}
    t0 = time.perf_counter()
    if kind == "steps-1thread":
        torch.set_num_threads(1)
    if kind == "steps-populate":
        try:
            mapped.madvise(22, 0, n)         # MADV_POPULATE_READ (Linux 5.14)
        except OSError as e:
            t["populate_error"] = str(e)
        t["populate_s"] = time.perf_counter() - t0
    a = time.perf_counter()
    dst = torch.empty(n, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    bufs = [torch.empty(chunk, dtype=torch.uint8, pin_memory=True) for _ in range(nbuf)]
    t["alloc_s"] = time.perf_counter() - a
    fd = os.open(path, os.O_RDONLY) if kind == "steps-pread" else None
    views = [memoryview(b.numpy()) for b in bufs]
    done = [None] * nbuf
    with torch.cuda.stream(stream):
        for j, start in enumerate(range(0, n, chunk)):
            b, size = j % nbuf, min(chunk, n - start)
            if done[b] is not None:
                a = time.perf_counter()
                done[b].synchronize()
                t["wait_s"] += time.perf_counter() - a
            a = time.perf_counter()
            if fd is not None:
                got = os.preadv(fd, [views[b][:size]], start)
                assert got == size
            else:
                bufs[b][:size].copy_(src[start:start + size])
            t["fill_s"] += time.perf_counter() - a
            dst[start:start + size].copy_(bufs[b][:size], non_blocking=True)
            done[b] = torch.cuda.Event()
            done[b].record(stream)
    stream.synchronize()
    t["upload_s"] = time.perf_counter() - t0
    t["gb_per_s"] = n / t["upload_s"] / 1e9
    t["ok"] = bool(torch.equal(dst[-4096:].cpu(), src[-4096:]))
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps-only", action="store_true", help="only the timed parts of the upload's variants")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        kind, path, n, c, b = a.child
        print(json.dumps(child(kind, path, int(n), int(c), int(b))))
        return 0
    big = 4096 * MB
    path = os.path.join(tempfile.gettempdir(), "ostinato-upload-probe.bin")
    if not os.path.exists(path) or os.path.getsize(path) < big:
        with open(path, "wb") as f:
            block = os.urandom(64 * MB)
            for _ in range(big // len(block)):
                f.write(block)
    with open(path, "rb") as f:               # in the page cache, as a warm start's file is
        while f.read(256 * MB):
            pass
    steps = [(k, n, c, b) for n in (256 * MB, big) for k in ("steps", "steps-1thread", "steps-populate", "steps-pread")
             for c, b in ((32, 3), (8, 3))]
    runs = steps if a.steps_only else [("pinned", 0, 32, 3), ("pinned", 0, 8, 2), ("pinned", 0, 2, 4), ("parts", 256 * MB, 0, 0),
            ("parts", big, 0, 0)]
    for n in (256 * MB, 1024 * MB, big):
        runs.append(("to", n, 0, 0))
        for c, b in ((32, 3), (8, 2), (8, 4), (4, 4), (16, 2)):
            runs.append(("upload", n, c, b))
    results = []
    for kind, n, c, b in runs:
        cmd = [sys.executable, os.path.abspath(__file__), "--out", a.out, "--child", kind, path, str(n), str(c), str(b)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        try:
            r = json.loads(p.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            r = {"kind": kind, "nbytes": n, "chunk_mb": c, "buffers": b, "error": p.stderr.strip()[-500:]}
        results.append(r)
        print(json.dumps(r), flush=True)
    with open(a.out, "w") as f:
        json.dump({"device": __import__("torch").cuda.get_device_name(0), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
