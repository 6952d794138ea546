"""On-disk tier shared by every process of the machine.

Layout under the cache directory (``OSTINATO_CACHE_DIR``, default ``~/.cache/ostinato``)::

    v1/entries/<digest[:2]>/<digest>.bin    encoded entry (entry.py)
    v1/index/<content group>/<digest>.json  its manifest, so why-miss finds same-content entries cheaply

Every file is written to a private temporary name and renamed into place: a reader sees the old file,
the new file or none, never a partial one, and concurrent writers of one key simply replace each other
with identical bytes. Recency is the file's mtime (set on write, touched on read); when the entries
exceed ``max_bytes`` the least recently used are deleted.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
import time
from pathlib import Path
from typing import Iterator

from .entry import HEADER_SIZE, CorruptEntry, Entry, decode, encode
from .keys import Manifest, canonical_json, content_group
from .tier import Tier, log

LAYOUT = "v1"
# Evict down to this fraction of the bound, so a full cache does not rescan on every put.
_LOW_WATER = 0.9
# Rescan the directory this often even under the bound: other processes write to it too.
_RESCAN_EVERY = 64
_STALE_TMP_S = 3600.0


def default_dir() -> Path:
    env = os.environ.get("OSTINATO_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ostinato"


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        # ns mtime from our clock: the kernel's coarse timestamps tie entries written in one tick.
        now = time.time_ns()
        os.utime(tmp, ns=(now, now))
        # No fsync: a torn file after a crash fails its sha256 and is a miss, which a cache can afford.
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class DiskTier(Tier):
    name = "disk"

    def __init__(self, root: str | os.PathLike[str] | None = None, max_bytes: int = 4 << 30) -> None:
        super().__init__()
        self.root = Path(root) if root is not None else default_dir()
        self.max_bytes = max_bytes
        self._base = self.root / LAYOUT
        self._approx: int | None = None  # bytes on disk as this process believes; None until scanned
        self._puts_since_scan = 0

    def _entry_path(self, digest: str) -> Path:
        return self._base / "entries" / digest[:2] / f"{digest}.bin"

    def _manifest_path(self, group: str, digest: str) -> Path:
        return self._base / "index" / group / f"{digest}.json"

    def get(self, digest: str) -> Entry | None:
        path = self._entry_path(digest)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            self.stats.add(misses=1)
            return None
        except OSError as e:
            self._failed("read", e)
            self.stats.add(misses=1)
            return None
        entry = self._decode_or_discard(blob, digest, lambda: self._unlink(path))
        if entry is None:
            return None
        try:
            now = time.time_ns()
            os.utime(path, ns=(now, now))  # recency for LRU eviction
        except OSError:
            pass  # evicted by another process meanwhile: the value we hold is still good
        return entry

    def put(self, entry: Entry) -> None:
        digest = entry.digest
        blob = encode(entry)
        m = entry.manifest
        try:
            _atomic_write(self._entry_path(digest), blob)
            _atomic_write(self._manifest_path(content_group(m["kind"], m["content"]), digest), canonical_json(m))
        except OSError as e:
            self._failed("write", e)
            return
        self.stats.add(puts=1)
        self._puts_since_scan += 1
        if self._approx is not None:
            self._approx += len(blob)
        if self._approx is None or self._approx > self.max_bytes or self._puts_since_scan >= _RESCAN_EVERY:
            self._enforce_bound()

    def _scan(self) -> list[tuple[int, str, int, Path]]:
        """(mtime_ns, name, size, path) of every entry file; removes temporaries of crashed writers."""
        found = []
        now = time.time()
        try:
            shards = list(os.scandir(self._base / "entries"))
        except FileNotFoundError:
            return []
        for shard in shards:
            try:
                files = list(os.scandir(shard.path))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for f in files:
                try:
                    st = f.stat()
                except FileNotFoundError:
                    continue
                if f.name.startswith(".tmp-"):
                    if now - st.st_mtime > _STALE_TMP_S:
                        self._unlink(Path(f.path))
                    continue
                found.append((st.st_mtime_ns, f.name, st.st_size, Path(f.path)))
        return found

    def _enforce_bound(self) -> None:
        self._puts_since_scan = 0
        try:
            files = self._scan()
        except OSError as e:
            self._failed("scan", e)
            return
        total = sum(f[2] for f in files)
        evicted = 0
        if total > self.max_bytes:
            files.sort()  # oldest first; the name breaks mtime ties so every process agrees
            target = int(self.max_bytes * _LOW_WATER)
            for _, name, size, path in files:
                if total <= target:
                    break
                group = self._group_of_file(path)
                self._unlink(path)
                if group is not None:
                    self._unlink(self._manifest_path(group, name[:-len(".bin")]))
                total -= size
                evicted += 1
        self._approx = total
        self.stats.add(evictions=evicted)
        self.stats.set_bytes(total)

    @staticmethod
    def _group_of_file(path: Path) -> str | None:
        """The content group of an entry file, from its header only (to find its index file)."""
        try:
            with open(path, "rb") as f:
                head = f.read(HEADER_SIZE)
                meta_len = struct.unpack_from("<I", head, 8)[0]
                m = json.loads(f.read(meta_len))["manifest"]
            return content_group(m["kind"], m["content"])
        except (OSError, ValueError, KeyError, TypeError, struct.error):
            return None  # a damaged entry: its index file, if any, is ignored by manifests()

    @staticmethod
    def _unlink(path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass  # another process removed it first
        except OSError as e:
            log.debug("ostinato cache: could not remove %s: %s", path, e)

    def manifests(self, group: str) -> list[Manifest]:
        out = []
        try:
            files = sorted((self._base / "index" / group).glob("*.json"))
        except OSError:
            return []
        for f in files:
            try:
                m = json.loads(f.read_bytes())
            except (OSError, ValueError):
                continue  # removed or half-gone under us; the index is advisory
            if isinstance(m, dict) and self._entry_path(f.stem).exists():
                out.append(m)
        return out

    def groups(self) -> list[tuple[str, str]]:
        found = set()
        index = self._base / "index"
        if not index.is_dir():
            return []
        for group in index.iterdir():
            ms = self.manifests(group.name)
            if ms:
                found.add((ms[0]["kind"], ms[0]["content"]))
        return sorted(found)

    def entries(self) -> Iterator[Entry]:
        for _, name, _, path in sorted(self._scan()):
            try:
                yield decode(path.read_bytes(), name[:-len(".bin")])
            except (OSError, CorruptEntry):
                continue

    def refresh_stats(self) -> None:
        """Measure the directory now (``bytes`` otherwise reflects the last scan)."""
        self._enforce_bound()

    def clear(self) -> None:
        shutil.rmtree(self._base, ignore_errors=True)
        self._approx = 0
        self.stats.set_bytes(0)
