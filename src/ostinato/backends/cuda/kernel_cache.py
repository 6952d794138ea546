"""Triton's compiled kernels (cubin, PTX, metadata) kept in ostinato's cache tiers.

Triton looks compiled kernels up by its own key (source, specialization, target, Triton version) in
a cache manager of its choosing; this plugs ostinato's cache (memory, disk, Redis, bundles) in as its
remote backend, so a second process, or a second machine sharing the Redis server or a bundle, loads
the binary instead of compiling. Triton still writes what it reads into a local directory, where it
loads kernels from: ``<Triton's cache dir>/ostinato/``, apart from Triton's own entries, whose group
files have another format. Nothing is changed when the user set TRITON_CACHE_MANAGER.
"""
from __future__ import annotations

import logging
import os

from ...cache import get_cache, make_key

log = logging.getLogger("ostinato")

KIND = "triton"


def _target() -> dict[str, str]:
    import torch
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return {"backend": "cuda", "arch": f"sm_{major}{minor}"}
    return {"backend": "cuda", "arch": "any"}   # Triton's own key names the target it compiled for


def _backend_class():
    from triton.runtime.cache import RemoteCacheBackend

    class OstinatoTritonCache(RemoteCacheBackend):
        """One Triton cache key's files, each an entry of kind "triton" in ostinato's cache."""

        def __init__(self, key: str):
            self._key = key
            self._target = _target()

        def _entry(self, filename: str):
            return make_key(KIND, f"{self._key}/{filename}", self._target)

        def get(self, filenames: list[str]) -> dict[str, bytes]:
            cache = get_cache()
            found = {}
            for name in filenames:
                blob = cache.get(self._entry(name))
                if blob is not None:
                    found[name] = blob
            return found

        def put(self, filename: str, data: bytes) -> None:
            get_cache().put(self._entry(filename), data if isinstance(data, bytes) else str(data).encode())

    return OstinatoTritonCache


def _manager_class():
    from triton import knobs
    from triton.runtime.cache import RemoteCacheManager

    class OstinatoTritonManager(RemoteCacheManager):
        """Triton's remote manager, materializing into a directory of its own: its group files have
        another format than the plain file cache's, and a process running Triton without ostinato
        must never read them from Triton's usual directory."""

        def __init__(self, key, override=False, dump=False):
            super().__init__(key, override=override, dump=dump)
            if not (override or dump):
                local = self._file_cache_manager
                local.cache_dir = os.path.join(knobs.cache.dir, "ostinato", key)
                local.lock_path = os.path.join(local.cache_dir, "lock")
                os.makedirs(local.cache_dir, exist_ok=True)

    return OstinatoTritonManager


_installed = False


def install() -> bool:
    """Route Triton's kernel cache through ostinato's tiers (once per process). False when the user
    chose a cache manager of their own, or Triton is missing."""
    global _installed
    if _installed:
        return True
    if os.environ.get("TRITON_CACHE_MANAGER"):
        log.info("ostinato: TRITON_CACHE_MANAGER is set; Triton kernels stay in the user's cache")
        return False
    try:
        from triton import knobs
        manager = _manager_class()
    except ImportError:
        return False
    knobs.cache.manager_class = manager
    knobs.cache.remote_manager_class = _backend_class()
    _installed = True
    return True
