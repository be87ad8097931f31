"""Checkpoints that cost what changed: the snapshot as a small skeleton plus content-addressed blobs.

Large values in ``state`` and ``outputs`` are stored once under the hash of their encoding, and long
lists in blocks (``flowkernel.store.packing``): a new checkpoint writes the skeleton and the blobs that did
not exist yet, so an output written once is never written again and a growing list costs its growth,
not its size. Given the run's ``Packer`` (the run shell keeps one per execution), a checkpoint also
costs its growth in CPU: values and blocks packed before are known without encoding them again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgspec
from flowkernel.core.events import event_type
from flowkernel.core.nesting import clipped, read_deep
from flowkernel.core.snapshot import RunSnapshot
from flowkernel.store.packing import LEAF, PACKED_PREFIX, Fetch, Packer, Resolver, blob_refs
from msgspec.structs import replace

if TYPE_CHECKING:
    from flowkernel.store.base import Store

__all__ = ["LEAF", "blob_refs", "checkpoint_blobs", "decode_checkpoint", "encode_checkpoint", "load_checkpoint",
           "packed_blobs"]

_skeleton_encoder = msgspec.json.Encoder()
_skeleton_decoder = msgspec.json.Decoder(RunSnapshot)


def encode_checkpoint(snapshot: RunSnapshot, packer: Packer | None = None) -> tuple[bytes, dict[str, bytes]]:
    """The skeleton to store and the blobs to store with it (idempotently, by key): those this
    checkpoint made, and any the ``packer`` made for events since it last handed them over."""
    packer = packer or Packer()
    pack = packer.pack
    state = {k: v if type(v) in _SMALL else pack(v, ours=True) for k, v in snapshot.state.items()}
    outputs = {k: v if type(v) in _SMALL else pack(v, ours=True) for k, v in snapshot.outputs.items()}
    skeleton = _skeleton_encoder.encode(replace(snapshot, state=state, outputs=outputs))
    return skeleton, packer.take_blobs()


_SMALL = frozenset({int, float, bool, type(None)})  # inline as they are; strings too, when short (see pack)


def reachable_blobs(roots: Iterable[Any], fetch: Fetch) -> dict[str, bytes]:
    """Every stored blob the packed values ``roots`` reach, nested ones included (a key that is not
    stored is left out: what is not there cannot be kept or carried)."""
    found: dict[str, bytes] = {}
    wanted: set[str] = set()
    for root in roots:
        _refs_of(root, wanted)
    while wanted:
        got = fetch(sorted(wanted))
        found.update(got)
        nested: set[str] = set()
        for body in got.values():
            if b'"$' in body:  # no marker, no reference: leaf values are not decoded
                _refs_of(read_deep(msgspec.json.decode, body), nested)
        wanted = nested - set(found)
    return found


def _refs_of(value: Any, out: set[str]) -> None:
    try:
        blob_refs(value, out)
    except RecursionError:  # nested deeper than the walk goes: the references within what can be read of it
        blob_refs(clipped(value), out)


def checkpoint_blobs(skeleton: bytes, fetch: Fetch) -> dict[str, bytes]:
    """Every blob a checkpoint reaches, nested ones included (what an exported run must carry)."""
    data = read_deep(msgspec.json.decode, skeleton)
    return reachable_blobs([data.get("state"), data.get("outputs")], fetch)


def packed_blobs(body: bytes, fetch: Fetch) -> dict[str, bytes]:
    """Every blob a stored body reaches: a checkpoint's skeleton, or an event stored packed (its large
    payloads refer to blobs, ``flowkernel.store.packing``); an event stored whole reaches none."""
    if body.startswith(PACKED_PREFIX):
        return reachable_blobs([read_deep(msgspec.json.decode, body)], fetch)
    if event_type(body) is not None:
        return {}
    return checkpoint_blobs(body, fetch)


def decode_checkpoint(skeleton: bytes, fetch: Fetch) -> RunSnapshot:
    """Rebuild a snapshot from its skeleton, fetching the blobs it refers to."""
    # Decoded straight into the struct (its state and outputs are maps of packed values, any JSON),
    # then those two unpacked: a third faster than decoding to dicts and converting them.
    snap = read_deep(_skeleton_decoder.decode, skeleton)
    resolver = Resolver(fetch)
    try:
        resolver.load([snap.state, snap.outputs])
        return replace(snap, state=resolver.unpack(snap.state), outputs=resolver.unpack(snap.outputs))
    except RecursionError:  # a value nested deeper than the walk goes: read what can be shown of it
        state, outputs = clipped(snap.state), clipped(snap.outputs)
        resolver.load([state, outputs])
        return replace(snap, state=resolver.unpack_clipped(state), outputs=resolver.unpack_clipped(outputs))


def load_checkpoint(store: Store, run_id: str, at_most: int | None = None) -> tuple[int, RunSnapshot] | None:
    """The newest stored checkpoint of a run (at or before ``at_most``), blobs resolved."""
    found = store.read_checkpoint(run_id, at_most=at_most)
    if found is None:
        return None
    seq, skeleton = found
    return seq, decode_checkpoint(skeleton, store.read_blobs)
