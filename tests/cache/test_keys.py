import json

from conftest import run_python

from ostinato.cache import Cache, make_key
from ostinato.cache.disk import DiskTier
from ostinato.cache.keys import Key, canonical_json, current_target, current_versions
from ostinato.cache.memory import MemoryTier

KEY_CODE = """
import json
from ostinato.cache import make_key
k = make_key("plan", b"program bytes", target={"backend": "cpu", "arch": "x86_64-AVX2"},
             versions={"torch": "2.13.0", "ostinato": "0.1.0", "triton": "", "cuda": ""})
here = make_key("plan", "0" * 64)
print(json.dumps([k.digest, k.manifest(), here.digest]))
"""


def test_identical_keys_in_two_fresh_processes():
    # Different hash seeds: a key that used hash() or set order would differ between the two.
    a = json.loads(run_python(KEY_CODE, env={"PYTHONHASHSEED": "1"}))
    b = json.loads(run_python(KEY_CODE, env={"PYTHONHASHSEED": "2"}))
    assert a == b
    k = make_key("plan", b"program bytes", target={"arch": "x86_64-AVX2", "backend": "cpu"},
                 versions={"cuda": "", "triton": "", "ostinato": "0.1.0", "torch": "2.13.0"})
    assert a[0] == k.digest  # and this process agrees, whatever order the dicts were built in
    assert a[2] == make_key("plan", "0" * 64).digest


def test_key_components_and_digest():
    k = make_key("plan", b"abc")
    m = k.manifest()
    assert m["target"] == current_target() and m["target"]["backend"] == "cpu"
    assert m["versions"] == current_versions() and m["versions"]["torch"]
    assert set(m["versions"]) == {"ostinato", "torch", "triton", "cuda"}
    import hashlib

    assert m["content"] == hashlib.sha256(b"abc").hexdigest()
    assert k.digest == hashlib.sha256(canonical_json(m)).hexdigest()
    assert Key.from_manifest(json.loads(json.dumps(m))).digest == k.digest
    assert make_key("plan", b"abd").digest != k.digest
    assert make_key("kernel", b"abc").digest != k.digest


def _cache(tmp_path):
    return Cache([MemoryTier(), DiskTier(tmp_path / "c")])


def test_changed_torch_version_changes_key_and_explain_names_it(tmp_path, caplog):
    cache = _cache(tmp_path)
    k = make_key("plan", b"prog")
    cache.put(k, b"lowered")
    other = make_key("plan", b"prog", versions={**current_versions(), "torch": "2.99.0"})
    assert other.digest != k.digest
    with caplog.at_level("DEBUG", logger="ostinato"):
        assert cache.get(other) is None
    assert "versions.torch" in caplog.text and "2.99.0" in caplog.text
    ex = cache.explain(other)
    assert not ex.hit
    assert ex.differs == {"versions.torch": (current_versions()["torch"], "2.99.0")}
    assert cache.explain(k).hit
    # Across processes: a fresh cache on the same directory finds the manifest in the disk index.
    ex2 = _cache(tmp_path).explain(other)
    assert ex2.differs == ex.differs


def test_changed_arch_changes_key_and_explain_names_it(tmp_path):
    cache = _cache(tmp_path)
    k = make_key("plan", b"prog", target={"backend": "cuda", "arch": "sm_90"})
    cache.put(k, b"cubin")
    other = make_key("plan", b"prog", target={"backend": "cuda", "arch": "sm_80"})
    assert other.digest != k.digest
    assert cache.get(other) is None
    assert cache.explain(other).differs == {"target.arch": ("sm_90", "sm_80")}
    # Nothing of this content stored at all: explain says so instead of inventing a diff.
    none = cache.explain(make_key("plan", b"never stored"))
    assert none.nearest is None and not none.hit and "no entry" in none.describe()
