"""The data segment's hash (program/format.py): schema 2 hashes DATA_CHUNK_BYTES chunks, each on its own
(a reader checks them on every core), then their digests; schema 1 hashed the bytes whole, and its files
still load and are still checked. The writer's streamed hash equals the reader's, however the bytes come."""
from __future__ import annotations

import hashlib
import os

import pytest
import torch

import ostinato
from ostinato.program import format as fmt
from ostinato.program import writer
from ostinato.program.format import ChecksumError, DataHasher, data_digest


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(fmt, "DATA_CHUNK_BYTES", 1000)
    return 1000


def _random_bytes(n: int, seed: int) -> bytes:
    g = torch.Generator().manual_seed(seed)
    return bytes(torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).tolist())


@pytest.mark.parametrize("n", [0, 1, 999, 1000, 1001, 4321, 5000])
def test_streamed_and_threaded_digests_agree_with_the_definition(small_chunks, n):
    data = _random_bytes(n, seed=n)
    chunks = [data[i:i + small_chunks] for i in range(0, n, small_chunks)]
    want = hashlib.sha256(b"".join(hashlib.sha256(c).digest() for c in chunks)).digest()
    assert data_digest(data, 2, threads=1) == want == data_digest(data, 2, threads=4)
    g = torch.Generator().manual_seed(n + 7)
    cuts = sorted(torch.randint(0, n + 1, (5,), generator=g).tolist())   # pieces across chunk edges
    h = DataHasher(2)
    for a, b in zip([0, *cuts], [*cuts, n]):
        h.update(data[a:b])
    assert h.digest() == want
    one = DataHasher(1)
    one.update(data)
    assert one.digest() == data_digest(data, 1) == hashlib.sha256(data).digest()
    if n > small_chunks:
        assert want != hashlib.sha256(data).digest()


def _program():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    x = torch.randn(2, 32)
    return model, x, ostinato.export(model, (x,))


def _flip_data_byte(path, seed: int) -> None:
    header = ostinato.program.reader.read_header(path)[0]
    at = header.data_offset + int(torch.randint(0, header.data_size, (1,),
                                                generator=torch.Generator().manual_seed(seed)))
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x01]))


@pytest.mark.parametrize("schema", [1, 2])
def test_files_of_both_schemas_load_and_damage_anywhere_is_refused(tmp_path, monkeypatch, small_chunks, schema):
    model, x, prog = _program()
    monkeypatch.setattr(writer, "SCHEMA_VERSION", schema)
    path = tmp_path / f"v{schema}.ost"
    prog.save(path)
    header = ostinato.program.reader.read_header(path)[0]
    assert header.schema == schema and header.data_size > 3 * small_chunks
    with open(path, "rb") as f:
        f.seek(header.data_offset)
        assert data_digest(f.read(header.data_size), schema) == header.data_sha256
    loaded = ostinato.load(path, verify="checksums")
    with torch.no_grad():
        torch.testing.assert_close(ostinato.compile(loaded, device="cpu")(x), model(x))
    seed = int.from_bytes(os.urandom(4), "little")
    _flip_data_byte(path, seed)
    with pytest.raises(ChecksumError, match="data segment"):
        ostinato.load(path, verify="checksums")


def test_digest_of_a_mapping_with_and_without_the_page_table_fill(tmp_path, monkeypatch):
    """Schema 2's digest read through a copy-on-write mapping (its chunks' page tables filled first, as a
    load does) equals the digest of the same bytes in memory, with the fill on or off, on one or several
    threads; a flipped byte changes it."""
    import mmap
    from ostinato.program import format as fmt
    n = 2 * fmt.DATA_CHUNK_BYTES + int(torch.randint(1, 4096, ()).item())
    data = torch.randint(0, 256, (n,), dtype=torch.uint8).numpy().tobytes()
    path = tmp_path / "blob"
    path.write_bytes(data)
    want = data_digest(data, 2)
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    for fill in (True, False):
        monkeypatch.setattr(fmt, "POPULATE", fill)
        for threads in (1, 3):
            assert data_digest(memoryview(mapped), 2, threads) == want
    mapped[n // 2] ^= 0x01
    assert data_digest(memoryview(mapped), 2) != want
    mapped.close()
