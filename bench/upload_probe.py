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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
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
    runs = [("pinned", 0, 32, 3), ("pinned", 0, 8, 2), ("pinned", 0, 2, 4), ("parts", 256 * MB, 0, 0),
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
