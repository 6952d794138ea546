"""The weights' sha256 is checked once per unchanged file on this machine (program/ir_cache.data_verified):
a file a load checked is not hashed again while its identity (device, inode, size, modification and
status-change times) is unchanged; any write to it, even one that puts its times back, makes the next
load hash it again and refuse damaged bytes; a file changed within the file clock's tick of the check is
not recorded; the record never reaches a shared tier. The process that saved a file checks it at its exit
(reader.check_saved), so the first load in another process does not hash it."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import ostinato
from ostinato.cache import Cache, set_cache
from ostinato.cache.memory import MemoryTier
from ostinato.program import ir_cache, reader
from ostinato.program.format import ChecksumError


class SharedMemoryTier(MemoryTier):
    """Stands in for Redis: a tier other machines would read (not one of the cache's LOCAL_TIERS)."""
    name = "shared"

    def __init__(self) -> None:
        super().__init__(64 << 20)
        self.kinds: list[str] = []

    def put(self, entry) -> None:
        self.kinds.append(entry.manifest["kind"])
        super().put(entry)


@pytest.fixture
def no_racy_window(monkeypatch):
    """Files in these tests are seconds old at most: record them as if the clock were fine-grained."""
    monkeypatch.setattr(ir_cache, "RACY_NS", 0)


@pytest.fixture
def tiers():
    local, shared = MemoryTier(64 << 20), SharedMemoryTier()
    set_cache(Cache([local, shared]))
    yield local, shared
    set_cache(None)


@pytest.fixture
def data_hashes(monkeypatch):
    """The sizes of the data segments reader.load hashes."""
    sizes: list[int] = []
    real = reader.data_digest

    def counting(data, schema, *args, **kwargs):
        sizes.append(memoryview(data).nbytes)
        return real(data, schema, *args, **kwargs)

    monkeypatch.setattr(reader, "data_digest", counting)
    return sizes


def _program():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    return model, ostinato.export(model, (torch.randn(3, 64),))


def test_checked_files_are_not_hashed_again(tmp_path, tiers, data_hashes, no_racy_window):
    model, prog = _program()
    path = tmp_path / "m.ost"
    prog.save(path)
    data_size = reader.read_header(path)[0].data_size
    x = torch.randn(3, 64)
    with torch.no_grad():
        ref = model(x)
    # save() records nothing when it writes (reader.check_saved does, at exit): the first load hashes the
    # data segment, the second does not, and runs the same
    ostinato.load(path, verify="checksums")
    assert data_hashes == [data_size]
    loaded = ostinato.load(path, verify="checksums")
    assert data_hashes == [data_size]
    torch.testing.assert_close(ostinato.compile(loaded, device="cpu")(x), ref)
    # a copy is another file (another inode): hashed on its first load, not on its second
    copy = tmp_path / "copy.ost"
    shutil.copyfile(path, copy)
    data_hashes.clear()
    ostinato.load(copy, verify="checksums")
    assert data_hashes.count(data_size) == 1
    ostinato.load(copy, verify=True)
    assert data_hashes.count(data_size) == 1
    # verify=False never hashes; the record lives on this machine's tiers only
    ostinato.load(copy, verify=False)
    assert data_hashes.count(data_size) == 1
    _local, shared = tiers
    assert ir_cache.DATA_VERIFIED_KIND not in shared.kinds
    assert ir_cache.VERIFIED_KIND in shared.kinds     # records about content do go to shared tiers


def test_a_write_that_puts_the_times_back_is_still_hashed_and_refused(tmp_path, tiers, data_hashes):
    _, prog = _program()
    path = tmp_path / "m.ost"
    prog.save(path)
    time.sleep(ir_cache.RACY_NS * 1.5e-9)   # older than the racy window: this load records its check
    ostinato.load(path, verify="checksums")
    header = reader.read_header(path)[0]
    before = os.stat(path)
    assert ir_cache.data_verified(before, header.data_sha256)
    rng = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    at = header.data_offset + int(torch.randint(0, header.data_size, (1,), generator=rng))
    with open(path, "r+b") as f:     # in place: same inode, same size
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x5A]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))   # modification time put back
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    data_hashes.clear()
    with pytest.raises(ChecksumError, match="data segment"):
        ostinato.load(path, verify="checksums")
    assert header.data_size in data_hashes


def test_files_changed_within_a_clock_tick_are_not_recorded(tmp_path, tiers):
    """A write in the same tick of the file clock as the check could leave both times unchanged: a file
    changed less than RACY_NS before (RACY_WHOLE_SECONDS_NS where the times are whole seconds) is not
    recorded, so its next load hashes it again."""
    path = tmp_path / "f"
    path.write_bytes(b"x")
    st = os.stat(path)
    digest = hashlib.sha256(b"x").digest()
    now_s = os.stat(path).st_mtime_ns // 1_000_000_000 * 1_000_000_000

    class Coarse:
        st_dev, st_ino, st_size = st.st_dev, st.st_ino, st.st_size
        st_mtime_ns = st_ctime_ns = now_s

    ir_cache.mark_data_verified(Coarse, digest)
    assert not ir_cache.data_verified(Coarse, digest)
    Coarse.st_mtime_ns = Coarse.st_ctime_ns = now_s - 10_000_000_000     # ten seconds old
    ir_cache.mark_data_verified(Coarse, digest)
    assert ir_cache.data_verified(Coarse, digest)
    assert not ir_cache.data_verified(Coarse, hashlib.sha256(b"y").digest())
    young = os.stat(path)                               # just written: within RACY_NS
    ir_cache.mark_data_verified(young, digest)
    assert not ir_cache.data_verified(young, digest)
    os.utime(path, ns=(young.st_atime_ns, young.st_mtime_ns - 10**9))   # the status-change time is now
    ir_cache.mark_data_verified(os.stat(path), digest)
    assert not ir_cache.data_verified(os.stat(path), digest)


@pytest.fixture
def exit_check(monkeypatch):
    """save() notes its files for the exit check (off in the other tests: conftest)."""
    monkeypatch.setenv("OSTINATO_CHECK_SAVED", "1")
    reader._saved.clear()


def _flip_byte(path, header, seed: int, mask: int = 0x01) -> None:
    """One byte of the data segment changed in place (same inode, same size), at a seeded offset."""
    rng = torch.Generator().manual_seed(seed)
    at = header.data_offset + int(torch.randint(0, header.data_size, (1,), generator=rng))
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ mask]))


def test_the_saving_process_records_its_files_at_exit(tmp_path, tiers, data_hashes, exit_check, monkeypatch):
    """check_saved (run at exit) hashes what this process saved, only once the racy window has passed,
    and records it, so a later load does not hash it; a file damaged after its save is not recorded and
    its load still refuses it."""
    _, prog = _program()
    good, bad = tmp_path / "good.ost", tmp_path / "bad.ost"
    prog.save(good)
    prog.save(bad)
    header = reader.read_header(bad)[0]
    _flip_byte(bad, header, seed=1)
    started = []
    real = reader.file_digest

    def spy(fd, *args, **kwargs):
        st = os.fstat(fd)
        started.append(time.time_ns() - (max(st.st_mtime_ns, st.st_ctime_ns) + ir_cache.racy_window_ns(st)))
        return real(fd, *args, **kwargs)

    monkeypatch.setattr(reader, "file_digest", spy)
    assert reader.check_saved() == 1          # good.ost only (bad.ost changed since its save)
    assert reader.check_saved() == 0          # nothing left to check
    assert len(started) == 1 and started[0] >= 0, "the hash began within the racy window"
    assert ir_cache.data_verified(os.stat(good), header.data_sha256)
    assert not ir_cache.data_verified(os.stat(bad), header.data_sha256)
    data_hashes.clear()
    ostinato.load(good, verify="checksums")
    assert data_hashes == []
    with pytest.raises(ChecksumError, match="data segment"):
        ostinato.load(bad, verify="checksums")
    assert data_hashes == [header.data_size]


def _saved_with_spy(tmp_path, monkeypatch, before=None, after=None):
    """A program saved (noted for the exit check), and reader.file_digest wrapped so that ``before`` and
    ``after`` (each given the path and the header) run around the real hash. Returns (path, header)."""
    _, prog = _program()
    path = tmp_path / "m.ost"
    prog.save(path)
    header = reader.read_header(path)[0]
    real = reader.file_digest

    def spy(fd, *args, **kwargs):
        if before is not None:
            before(path, header)
        digest = real(fd, *args, **kwargs)
        if after is not None:
            after(path, header)
        return digest

    monkeypatch.setattr(reader, "file_digest", spy)
    return path, header


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_write_while_the_exit_check_hashes_is_never_recorded(tmp_path, tiers, exit_check, monkeypatch, when):
    """A write in place during the check: before the hash reads the byte (a mismatch) or after it (the
    record names the file's identity from before the write, which the write changed): either way the
    file as it now is has no record."""
    flip = {when: lambda path, header: _flip_byte(path, header, seed=2)}
    path, header = _saved_with_spy(tmp_path, monkeypatch, **flip)
    assert reader.check_saved() == (1 if when == "after" else 0)
    assert not ir_cache.data_verified(os.stat(path), header.data_sha256)
    with pytest.raises(ChecksumError, match="data segment"):
        ostinato.load(path, verify="checksums")


def test_a_file_cut_short_during_the_exit_check_is_a_mismatch(tmp_path, tiers, exit_check, monkeypatch):
    """Read with pread, not mapped: a file truncated while it is hashed gives no digest (a mapping would
    fault and end the process with SIGBUS)."""
    path, header = _saved_with_spy(
        tmp_path, monkeypatch, before=lambda path, header: os.truncate(path, header.data_offset + header.data_size // 2))
    assert reader.check_saved() == 0
    assert not ir_cache.data_verified(os.stat(path), header.data_sha256)


@pytest.mark.parametrize("limit", ["wait", "bytes", "switch"])
def test_files_the_exit_check_leaves_are_hashed_by_their_first_load(tmp_path, tiers, data_hashes, exit_check,
                                                                    monkeypatch, limit):
    """A clock too coarse to wait for, a data segment past the exit's byte budget, and the check switched
    off (OSTINATO_CHECK_SAVED=0): nothing recorded, and the first load hashes as before."""
    if limit == "wait":
        monkeypatch.setattr(ir_cache, "RACY_NS", 60_000_000_000)    # a window no exit waits out
    elif limit == "bytes":
        monkeypatch.setattr(reader, "MAX_EXIT_CHECK_BYTES", 1024)
    else:
        monkeypatch.setenv("OSTINATO_CHECK_SAVED", "0")
    _, prog = _program()
    path = tmp_path / "m.ost"
    prog.save(path)
    assert reader.check_saved() == 0
    monkeypatch.setattr(ir_cache, "RACY_NS", 0)     # so that the load below records what it hashed
    ostinato.load(path, verify="checksums")
    assert data_hashes == [reader.read_header(path)[0].data_size]


def test_one_exit_hook_and_none_in_a_forked_child(tmp_path, exit_check):
    import atexit
    _, prog = _program()
    before = atexit._ncallbacks()
    prog.save(tmp_path / "a.ost")
    prog.save(tmp_path / "b.ost")
    assert atexit._ncallbacks() - before <= 1 and reader._exit_hook
    assert len(reader._saved) == 2
    pid = os.fork()
    if pid == 0:    # the child: nothing of its parent's to check at its exit
        os._exit(0 if not reader._saved else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(reader._saved) == 2


def test_a_fresh_process_does_not_hash_a_file_another_saved(tmp_path):
    """Two processes sharing a disk cache: the first saves and exits, the second's load hashes nothing."""
    env = dict(os.environ, OSTINATO_CACHE_DIR=str(tmp_path / "cache"), OSTINATO_CHECK_SAVED="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    path = tmp_path / "m.ost"
    save = textwrap.dedent(f"""
        import torch, ostinato
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
        ostinato.export(model, (torch.randn(3, 64),)).save({str(path)!r})
    """)
    load = textwrap.dedent(f"""
        import ostinato
        prog = ostinato.load({str(path)!r}, verify="checksums")
        print("HASH", prog.timings["load_data_hash"])
    """)
    subprocess.run([sys.executable, "-c", save], env=env, check=True, timeout=300)
    out = subprocess.run([sys.executable, "-c", load], env=env, check=True, timeout=300, capture_output=True,
                         text=True).stdout
    assert "HASH 0.0" in out.splitlines()
    # without the exit check (its record removed), the same load hashes
    shutil.rmtree(tmp_path / "cache")
    out = subprocess.run([sys.executable, "-c", load], env=env, check=True, timeout=300, capture_output=True,
                         text=True).stdout
    assert "HASH 0.0" not in out.splitlines()
