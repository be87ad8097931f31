"""Checkpoints that cost what changed: the snapshot as a small skeleton plus content-addressed blobs.

Large values in ``state`` and ``outputs`` are stored once under the hash of their encoding; long
lists are cut into fixed-size chunks: full chunks are blobs, the partial tail stays in the skeleton,
so appending to a list stores a chunk only when one fills up (and no half-filled chunk is left behind). A new
checkpoint therefore writes the skeleton and the blobs that did not exist yet: an output written
once is never written again, and a growing list costs its growth, not its size.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec
from flowkernel.snapshot import RunSnapshot
from msgspec.structs import replace

if TYPE_CHECKING:
    from flowkernel.store.base import Store

CHUNK = 64  # list items per chunk
INLINE_BYTES = 512  # values smaller than this stay in the skeleton

_encoder = msgspec.json.Encoder(order="deterministic")  # blobs: equal content, equal bytes, equal key
_skeleton_encoder = msgspec.json.Encoder()  # the skeleton is not content-addressed: no sorting
_PLAIN = (int, float, bool, type(None))
_MARKER_SHAPES = ({"$blob"}, {"$chunks", "$tail"}, {"$lit"})


def _key(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()[:32]


class _Packer:
    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    def blob(self, value: Any) -> dict[str, Any]:
        body = _encoder.encode(value)
        key = _key(body)
        self.blobs[key] = body
        return {"$blob": key}

    def items(self, values: list[Any]) -> list[Any]:
        # Short strings and numbers are most list items: keep them without a call each.
        return [v if type(v) in _PLAIN or (type(v) is str and len(v) < INLINE_BYTES) else self.pack(v)
                for v in values]

    def pack(self, value: Any) -> Any:
        if isinstance(value, list):
            if len(value) > CHUNK:
                full = len(value) - len(value) % CHUNK
                keys = [self.blob(self.items(value[i:i + CHUNK]))["$blob"] for i in range(0, full, CHUNK)]
                return {"$chunks": keys, "$tail": self.items(value[full:])}
            packed: Any = self.items(value)
        elif isinstance(value, dict):
            packed = {k: self.pack(v) for k, v in value.items()}
            if set(value) in _MARKER_SHAPES:  # user data that looks like a marker is wrapped, not read as one
                packed = {"$lit": packed}
        elif isinstance(value, str) and len(value) >= INLINE_BYTES:
            return self.blob(value)
        else:
            return value
        if len(_encoder.encode(packed)) >= INLINE_BYTES:
            return self.blob(packed)
        return packed


def encode_checkpoint(snapshot: RunSnapshot) -> tuple[bytes, dict[str, bytes]]:
    """The skeleton to store and the blobs it refers to (store them idempotently, by key)."""
    packer = _Packer()
    skeleton = replace(snapshot, state={k: packer.pack(v) for k, v in snapshot.state.items()},
                       outputs={k: packer.pack(v) for k, v in snapshot.outputs.items()})
    return _skeleton_encoder.encode(skeleton), packer.blobs


def blob_refs(value: Any, out: set[str]) -> None:
    """Add to ``out`` the keys of the blobs ``value`` (a decoded skeleton or blob) refers to directly."""
    if isinstance(value, dict):
        if set(value) == {"$blob"}:
            out.add(value["$blob"])
        elif set(value) == {"$chunks", "$tail"}:
            out.update(value["$chunks"])
            blob_refs(value["$tail"], out)
        elif set(value) == {"$lit"}:
            for v in value["$lit"].values():
                blob_refs(v, out)
        else:
            for v in value.values():
                blob_refs(v, out)
    elif isinstance(value, list):
        for v in value:
            blob_refs(v, out)


def checkpoint_blobs(skeleton: bytes, fetch: Callable[[Iterable[str]], Mapping[str, bytes]]) -> dict[str, bytes]:
    """Every blob a checkpoint reaches, nested ones included (what an exported run must carry)."""
    found: dict[str, bytes] = {}
    data = msgspec.json.decode(skeleton)
    wanted: set[str] = set()
    blob_refs(data.get("state"), wanted)
    blob_refs(data.get("outputs"), wanted)
    while wanted:
        got = fetch(sorted(wanted))
        found.update(got)
        nested: set[str] = set()
        for body in got.values():
            blob_refs(msgspec.json.decode(body), nested)
        wanted = nested - set(found)
    return found


def decode_checkpoint(skeleton: bytes, fetch: Callable[[Iterable[str]], Mapping[str, bytes]]) -> RunSnapshot:
    """Rebuild a snapshot from its skeleton, fetching the blobs it refers to."""
    data = msgspec.json.decode(skeleton)
    cache: dict[str, Any] = {}
    refs = blob_refs

    def load(keys: set[str]) -> None:
        while keys:
            got = fetch(sorted(keys))
            missing = keys - set(got)
            if missing:
                raise KeyError(f"checkpoint blobs missing from the store: {sorted(missing)[:3]}")
            nested: set[str] = set()
            for k, body in got.items():
                cache[k] = msgspec.json.decode(body)
                refs(cache[k], nested)
            keys = nested - set(cache)

    def unpack(value: Any) -> Any:
        if isinstance(value, dict):
            if set(value) == {"$blob"}:
                return unpack(cache[value["$blob"]])
            if set(value) == {"$chunks", "$tail"}:
                items = [item for key in value["$chunks"] for item in unpack(cache[key])]
                return items + [unpack(v) for v in value["$tail"]]
            if set(value) == {"$lit"}:
                return {k: unpack(v) for k, v in value["$lit"].items()}
            return {k: unpack(v) for k, v in value.items()}
        if isinstance(value, list):
            return [unpack(v) for v in value]
        return value

    wanted: set[str] = set()
    refs(data["state"], wanted)
    refs(data["outputs"], wanted)
    load(wanted)
    data["state"] = unpack(data["state"])
    data["outputs"] = unpack(data["outputs"])
    return msgspec.convert(data, RunSnapshot)


def load_checkpoint(store: Store, run_id: str, at_most: int | None = None) -> tuple[int, RunSnapshot] | None:
    """The newest stored checkpoint of a run (at or before ``at_most``), blobs resolved."""
    found = store.read_checkpoint(run_id, at_most=at_most)
    if found is None:
        return None
    seq, skeleton = found
    return seq, decode_checkpoint(skeleton, store.read_blobs)
