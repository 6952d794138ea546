"""The byte form of one cache entry, shared by every tier: header, JSON metadata, value. Never pickle.

    magic "OSTCENT1" | u32 meta_len | u64 value_len | meta (canonical JSON) | value

meta = {"digest", "manifest", "sha256" (of the value), "size"}. A remote tier is untrusted, so decoding
checks everything it can — framing, JSON, that the manifest hashes to the digest asked for, and the
value's sha256 — and raises CorruptEntry, which a tier turns into discard + error count + miss.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from .keys import Key, Manifest, canonical_json, sha256_hex

MAGIC = b"OSTCENT1"
_HEAD = struct.Struct("<8sIQ")
HEADER_SIZE = _HEAD.size


class CorruptEntry(ValueError):
    """Internal: an entry's bytes are damaged or not what the key promised. Never reaches a user."""


@dataclass(frozen=True)
class Entry:
    manifest: Manifest
    value: bytes

    @property
    def digest(self) -> str:
        return sha256_hex(canonical_json(self.manifest))

    @classmethod
    def of(cls, key: Key, value: bytes) -> "Entry":
        return cls(key.manifest(), bytes(value))


def encode(entry: Entry) -> bytes:
    meta = canonical_json({"digest": entry.digest, "manifest": entry.manifest,
                           "sha256": sha256_hex(entry.value), "size": len(entry.value)})
    return _HEAD.pack(MAGIC, len(meta), len(entry.value)) + meta + entry.value


def decode_meta(blob: bytes) -> tuple[dict[str, Any], int]:
    """The metadata and the offset of the value; checks framing and JSON, not the value's hash."""
    if len(blob) < _HEAD.size:
        raise CorruptEntry(f"entry of {len(blob)} bytes is shorter than its header")
    magic, meta_len, value_len = _HEAD.unpack_from(blob)
    if magic != MAGIC:
        raise CorruptEntry(f"bad entry magic {magic!r}")
    if _HEAD.size + meta_len + value_len != len(blob):
        raise CorruptEntry(f"entry lengths (meta {meta_len}, value {value_len}) do not add up to {len(blob)}")
    try:
        meta = json.loads(blob[_HEAD.size:_HEAD.size + meta_len].decode("ascii"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CorruptEntry(f"entry metadata is not JSON: {e}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("manifest"), dict):
        raise CorruptEntry("entry metadata lacks a manifest")
    if meta.get("size") != value_len or not isinstance(meta.get("sha256"), str):
        raise CorruptEntry("entry metadata size/sha256 do not describe the value")
    if meta.get("digest") != sha256_hex(canonical_json(meta["manifest"])):
        raise CorruptEntry("entry manifest does not hash to its digest")
    return meta, _HEAD.size + meta_len


def decode(blob: bytes, expect_digest: str | None = None) -> Entry:
    meta, start = decode_meta(blob)
    if expect_digest is not None and meta["digest"] != expect_digest:
        raise CorruptEntry(f"entry holds {meta['digest'][:12]}, not the {expect_digest[:12]} asked for")
    value = bytes(blob[start:])
    if sha256_hex(value) != meta["sha256"]:
        raise CorruptEntry("entry value does not match its sha256")
    return Entry(meta["manifest"], value)
