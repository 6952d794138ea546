"""A real Redis server for the cache tests, started here on loopback and stopped at the end."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "src")


@dataclass
class RedisServer:
    proc: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(workdir: str) -> RedisServer:
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed: the cache tests need a real Redis "
                    "(apt-get install redis-server)", pytrace=False)
    port = _free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", workdir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=0.5, socket_connect_timeout=0.5)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.RedisError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"redis-server did not come up on port {port}", pytrace=False)
            time.sleep(0.05)
    client.close()
    return RedisServer(proc, port)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    server = start_redis(str(tmp_path_factory.mktemp("redis")))
    yield server
    server.stop()


@pytest.fixture
def redis_prefix() -> str:
    # Tests share one server per worker; a prefix each keeps their keys apart.
    return f"ostinato-test:{uuid.uuid4().hex[:8]}:"


@pytest.fixture(autouse=True)
def _no_real_cache(tmp_path, monkeypatch):
    """Whatever a test does, the process-wide cache lives under tmp_path, never in ~/.cache."""
    from ostinato.cache import set_cache

    monkeypatch.setenv("OSTINATO_CACHE_DIR", str(tmp_path / "default-cache"))
    monkeypatch.delenv("OSTINATO_REDIS_URL", raising=False)
    set_cache(None)
    yield
    set_cache(None)


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 60) -> str:
    """Run ``code`` in a fresh interpreter with ostinato importable; return its stdout."""
    full = {**os.environ, "PYTHONPATH": SRC, **(env or {})}
    r = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"subprocess failed:\n{r.stderr}"
    return r.stdout
