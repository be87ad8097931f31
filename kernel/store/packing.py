"""JSON values as a small skeleton plus content-addressed blobs, packed in proportion to what changed.

A long list becomes ``{"$chunks": [key, ...], "$tail": [...]}``: its items in blocks aligned to their
size (``LEAF`` items, then ``FANOUT`` blocks of the level below, and so on), each block a blob named by
the hash of its encoding, and the last few items inline. A list that grows at its end keeps all of its
blocks, so the skeleton of a list of n items holds O(log n) keys and appending costs the new items
only. Strings of ``INLINE_BYTES`` or more, and containers whose packed form is that large, are blobs
too (``{"$blob": key}``); user data shaped like a marker is wrapped in ``{"$lit": ...}``.

A ``Packer`` remembers the blocks it packed, with items of its own (decoded copies): a block of a new
list whose items are those very objects (a list built from an earlier one, ``[*before, new]``) is known
after one pointer comparison per item, without encoding anything. Values handed back by ``rebuild``
are made of those items, so a list a node builds from what it was given packs in O(growth + log n).
What the packer remembers is never mutated: snapshot and event values are not.

Checkpoints (``flowkernel.store.checkpoint``) and the large payloads of events are packed this way; a packed
event's stored body starts with ``PACKED_PREFIX``, and stores resolve such bodies when they read them
(``resolve_bodies``), so readers of the log always see whole events.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec
from flowkernel.core.events import PACKED_PREFIX as PACKED_PREFIX  # where it is defined; re-exported
from flowkernel.core.nesting import MARKER, MAX_DEPTH, clipped, read_deep

LEAF = 8  # list items per leaf block
FANOUT = 8  # blocks per block of the next level
INLINE_BYTES = 512  # values smaller than this stay inline

_encode = msgspec.json.Encoder().encode


def _decode(body: bytes) -> Any:
    return read_deep(msgspec.json.decode, body)


_PLAIN = (int, float, bool, type(None))
_IMMUTABLE = frozenset({str, int, float, bool, type(None)})
# ``{"$keys"}`` is the body of a block of blocks: user data of that shape is wrapped too, so that
# ``blob_refs`` can take any ``$keys`` for references.
_MARKER_SHAPES = ({"$blob"}, {"$chunks", "$tail"}, {"$lit"}, {"$keys"})
_BLOCK_LIMIT = 100_000  # blocks remembered before the memo starts over
_VALUE_LIMIT = 512  # whole values remembered (the oldest are forgotten first)
_STRING_LIMIT = 10_000  # long strings remembered

Fetch = Callable[[Iterable[str]], Mapping[str, bytes]]


def blob_key(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()[:32]


def _is_chunked(value: Any) -> bool:
    return type(value) is dict and len(value) == 2 and "$chunks" in value and "$tail" in value


def _is_blob(value: Any) -> bool:
    return type(value) is dict and len(value) == 1 and "$blob" in value


class _Block:
    """A packed block of a list: its key, how many items it spans, those items (the packer's own), and
    whether its encoding holds a ``null`` (see ``Packer.nulls``)."""

    __slots__ = ("items", "key", "nulls", "size")

    def __init__(self, key: str, size: int, items: list[Any], nulls: bool) -> None:
        self.key, self.size, self.items, self.nulls = key, size, items, nulls


class Packer:
    """Packs values into skeletons and blobs, remembering the blocks it made (see the module).

    ``blobs`` collects the blobs made since the last ``take_blobs``: whoever stores a skeleton stores
    them in the same transaction (they are content-addressed: storing one twice changes nothing).
    ``nulls`` turns true when a blob or block packed since it was last reset holds a ``null``: where
    the encoder wrote a NaN or Infinity too, so a packed value without one needs no look for them
    (``flowkernel.core.nonfinite``).
    """

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.nulls = False
        self._by_first: dict[int, list[_Block]] = {}  # id(first item) -> blocks starting with it
        self._by_key: dict[str, _Block] = {}
        self._index: dict[tuple[str, ...], str] = {}  # child keys -> key of the block made of them
        self._strings: dict[int, tuple[str, dict[str, str]]] = {}  # id -> (long string, its blob marker)
        self._string_of: dict[str, str] = {}  # blob key -> the long string it holds
        self._values: dict[int, tuple[Any, Any]] = {}  # id -> (a value of ours, its packed form)

    def take_blobs(self) -> dict[str, bytes]:
        blobs, self.blobs = self.blobs, {}
        return blobs

    # -- packing ----------------------------------------------------------------------------

    def pack(self, value: Any, *, ours: bool = False) -> Any:
        """``value``'s packed form, a blob itself when large (a long list stays a skeleton).

        ``ours``: ``value`` is a snapshot's, never mutated, so it may be known by identity."""
        packed = self.pack_inline(value, ours=ours)
        return packed if packed is value else self._blob_if_large(packed)

    def pack_inline(self, value: Any, *, ours: bool = False) -> Any:
        """``value``'s packed form, never a blob at the top: what an event body holds."""
        t = type(value)
        if t in _PLAIN or (t is str and len(value) < INLINE_BYTES):
            return value
        if ours:
            known = self._values.get(id(value))
            if known is not None and known[0] is value:
                return known[1]
        if t is str:
            return self._string(value)
        if t is list:
            packed: Any = self._list(value)
        elif isinstance(value, Mapping):
            packed = self._dict(value)
        elif isinstance(value, list | tuple):
            packed = self._list(list(value))
        else:
            return value  # the encoder says whether it is JSON
        if ours:
            self.remember(value, packed)
        return packed

    def remember(self, value: Any, packed: Any) -> None:
        """``value`` (one of ours: never mutated) packs to ``packed``."""
        if type(value) is list or type(value) is dict:
            if len(self._values) >= _VALUE_LIMIT:
                del self._values[next(iter(self._values))]
            self._values[id(value)] = (value, packed)

    def _item(self, value: Any) -> Any:
        """One item of a list or value of a map: small ones inline, large ones as blobs."""
        t = type(value)
        if t in _PLAIN or (t is str and len(value) < INLINE_BYTES):
            return value
        if t is str:
            return self._string(value)
        return self._blob_if_large(self.pack_inline(value))

    def _string(self, value: str) -> dict[str, str]:
        known = self._strings.get(id(value))  # strings never change: known by identity
        if known is not None and known[0] is value:
            return known[1]
        marker = self._blob(value)
        if len(self._strings) >= _STRING_LIMIT:
            self._strings.clear()
            self._string_of.clear()
        self._strings[id(value)] = (value, marker)
        self._string_of[marker["$blob"]] = value
        return marker

    def _dict(self, value: Mapping[Any, Any]) -> Any:
        packed = {k: self._item(v) for k, v in value.items()}
        if set(value) in _MARKER_SHAPES:  # user data that looks like a marker is wrapped, not read as one
            return {"$lit": packed}
        return packed

    def _list(self, value: list[Any]) -> Any:
        n = len(value)
        if n <= LEAF:
            return [self._item(v) for v in value]
        full = n - n % LEAF
        keys: list[str] = []
        pos = 0
        while pos < full:  # the largest aligned block that fits, level by level
            size = LEAF
            while pos % (size * FANOUT) == 0 and pos + size * FANOUT <= full:
                size *= FANOUT
            keys.append(self._block(value, pos, size).key)
            pos += size
        return {"$chunks": keys, "$tail": [self._item(v) for v in value[full:]]}

    def _block(self, value: list[Any], pos: int, size: int) -> _Block:
        span = value[pos:pos + size]
        for block in self._by_first.get(id(span[0]), ()):
            # Identical objects compare equal without a look inside: a list built from our own items
            # costs one pointer comparison per item.
            if block.size == size and block.items == span:
                self.nulls |= block.nulls
                return block
        if size == LEAF:
            body = _encode([self._item(v) for v in span])
            key = blob_key(body)
            self.blobs.setdefault(key, body)
            nulls = b"null" in body
            self.nulls |= nulls
            # Strings and numbers never change; anything else is copied: whoever made ``span`` may change it.
            items: list[Any] = span if all(type(v) in _IMMUTABLE for v in span) else _decode(_encode(span))
        else:
            step = size // FANOUT
            children = [self._block(value, pos + i, step) for i in range(0, size, step)]
            child_keys = tuple(c.key for c in children)
            key = self._index.get(child_keys, "")
            if not key:
                body = _encode({"$keys": child_keys})
                key = self._index[child_keys] = blob_key(body)
                self.blobs.setdefault(key, body)
            items = [item for c in children for item in c.items]
            nulls = any(c.nulls for c in children)
        return self._remember_block(key, size, items, nulls)

    def _remember_block(self, key: str, size: int, items: list[Any], nulls: bool) -> _Block:
        if len(self._by_key) >= _BLOCK_LIMIT:
            self._by_first.clear()
            self._by_key.clear()
            self._index.clear()
        block = _Block(key, size, items, nulls)
        self._by_key[key] = block
        self._by_first.setdefault(id(items[0]), []).append(block)
        return block

    def _blob(self, packed: Any) -> dict[str, str]:
        body = _encode(packed)
        self.nulls |= b"null" in body
        key = blob_key(body)
        self.blobs.setdefault(key, body)
        return {"$blob": key}

    def _blob_if_large(self, packed: Any) -> Any:
        # A chunked list stays inline wherever it is: its skeleton is small, and a new blob for it at
        # every change would cost a row each time.
        if _is_blob(packed) or _is_chunked(packed) or len(_encode(packed)) < INLINE_BYTES:
            return packed
        return self._blob(packed)

    # -- rebuilding -------------------------------------------------------------------------

    def resolver(self, fetch: Fetch | None = None) -> Resolver:
        """A resolver that takes the blocks and blobs this packer knows before fetching any."""
        return Resolver(fetch or (lambda keys: {}), self)

    def known_items(self, key: str) -> list[Any] | None:
        block = self._by_key.get(key)
        return block.items if block is not None else None

    def known_body(self, key: str) -> bytes | None:
        return self.blobs.get(key)

    def known_string(self, key: str) -> str | None:
        return self._string_of.get(key)


class Resolver:
    """Turns packed values back into whole ones: blobs are fetched in batches and decoded once, and
    blocks a ``Packer`` knows are taken from it (their items are its own objects)."""

    def __init__(self, fetch: Fetch, packer: Packer | None = None) -> None:
        self._fetch = fetch
        self._packer = packer
        self._decoded: dict[str, Any] = {}  # key -> the blob's JSON, still packed
        self._items: dict[str, list[Any]] = {}  # block key -> its items, whole

    def load(self, values: Iterable[Any]) -> None:
        """Fetch every blob ``values`` refer to, however deep, that is not known yet."""
        wanted: set[str] = set()
        for v in values:
            self._refs(v, wanted)
        while wanted:
            got = dict(self._own(wanted))
            rest = wanted - set(got)
            if rest:
                got.update(self._fetch(sorted(rest)))
            missing = wanted - set(got)
            if missing:
                raise KeyError(f"blobs missing from the store: {sorted(missing)[:3]}")
            nested: set[str] = set()
            for k, body in got.items():
                value = self._decoded[k] = _decode(body)
                if type(value) is dict and len(value) == 1 and "$keys" in value:
                    nested.update(c for c in value["$keys"] if not self._has_items(c))
                else:
                    try:
                        self._refs(value, nested)
                    except RecursionError:  # nested too deeply to walk: what ``unpack_clipped`` reads of it
                        self._refs(clipped(value), nested)
            wanted = {k for k in nested if k not in self._decoded}

    def _own(self, keys: Iterable[str]) -> Iterable[tuple[str, bytes]]:
        if self._packer is None:
            return ()
        return ((k, b) for k in keys if (b := self._packer.known_body(k)) is not None)

    def _has_items(self, key: str) -> bool:
        return key in self._items or key in self._decoded or (
            self._packer is not None and self._packer.known_items(key) is not None)

    def _refs(self, value: Any, out: set[str]) -> None:
        if type(value) is dict:
            if _is_blob(value):
                key = value["$blob"]
                if key not in self._decoded and (self._packer is None or self._packer.known_string(key) is None):
                    out.add(key)
            elif _is_chunked(value):
                out.update(k for k in value["$chunks"] if not self._has_items(k))
                self._refs(value["$tail"], out)
            elif len(value) == 1 and "$lit" in value:
                for v in value["$lit"].values():
                    self._refs(v, out)
            else:
                for v in value.values():
                    self._refs(v, out)
        elif type(value) is list:
            for v in value:
                self._refs(v, out)

    def unpack(self, value: Any) -> Any:
        """The whole value (fetching what it refers to when needed)."""
        if type(value) is dict:
            if _is_blob(value):
                return self.unpack(self._body(value["$blob"]))
            if _is_chunked(value):
                items: list[Any] = []
                for key in value["$chunks"]:
                    items += self._block_items(key)
                items += [self.unpack(v) for v in value["$tail"]]
                return items
            if len(value) == 1 and "$lit" in value:
                return {k: self.unpack(v) for k, v in value["$lit"].items()}
            return {k: self.unpack(v) for k, v in value.items()}
        if type(value) is list:
            return [self.unpack(v) for v in value]
        return value

    def unpack_clipped(self, value: Any, limit: int = MAX_DEPTH) -> Any:
        """``unpack`` with what lies below ``limit`` levels replaced by ``nesting.MARKER``, for a value
        nested deeper than ``unpack`` can walk."""
        def walk(v: Any, depth: int) -> Any:
            if type(v) is dict:
                if _is_blob(v):
                    return walk(self._body(v["$blob"]), depth)
                if depth >= limit:
                    return MARKER
                if _is_chunked(v):
                    items = [clipped(item, limit - depth - 1) for key in v["$chunks"] for item in self._block_items(key)]
                    return items + [walk(x, depth + 1) for x in v["$tail"]]
                inner = v["$lit"] if len(v) == 1 and "$lit" in v else v
                return {k: walk(x, depth + 1) for k, x in inner.items()}
            if type(v) is list:
                return MARKER if depth >= limit else [walk(x, depth + 1) for x in v]
            return v

        return walk(value, 0)

    def _body(self, key: str) -> Any:
        if key not in self._decoded:
            known = self._packer.known_string(key) if self._packer is not None else None
            if known is not None:
                return known
            self.load([{"$blob": key}])
        return self._decoded[key]

    def _block_items(self, key: str) -> list[Any]:
        items = self._items.get(key)
        if items is None and self._packer is not None:
            items = self._packer.known_items(key)
        if items is not None:
            return items
        if key not in self._decoded:
            self.load([{"$chunks": [key], "$tail": []}])
        body = self._decoded[key]
        if type(body) is dict and len(body) == 1 and "$keys" in body:
            items = [item for child in body["$keys"] for item in self._block_items(child)]
        else:
            items = [self.unpack(v) for v in body]
        self._items[key] = items
        return items

    def resolve_bodies(self, bodies: list[bytes]) -> list[bytes]:
        """Stored event bodies as whole events: packed ones resolved, the others as they are."""
        packed = [i for i, b in enumerate(bodies) if b.startswith(PACKED_PREFIX)]
        if not packed:
            return bodies
        out = list(bodies)
        decoded = {i: _decode(bodies[i]) for i in packed}
        self.load(decoded.values())
        for i, event in decoded.items():
            del event["$packed"]
            out[i] = _encode({k: self.unpack(v) for k, v in event.items()})
        return out


def blob_refs(value: Any, out: set[str]) -> None:
    """Add to ``out`` the keys of the blobs ``value`` (a decoded skeleton, packed event or blob) refers
    to directly."""
    if type(value) is dict:
        if _is_blob(value):
            out.add(value["$blob"])
        elif _is_chunked(value):
            out.update(value["$chunks"])
            blob_refs(value["$tail"], out)
        elif len(value) == 1 and "$keys" in value:
            out.update(value["$keys"])
        elif len(value) == 1 and "$lit" in value:
            for v in value["$lit"].values():
                blob_refs(v, out)
        else:
            for v in value.values():
                blob_refs(v, out)
    elif type(value) is list:
        for v in value:
            blob_refs(v, out)


def resolve_bodies(bodies: list[bytes], fetch: Fetch) -> list[bytes]:
    """What a store's ``read_events`` returns: every stored body whole (packed ones resolved)."""
    if not any(b.startswith(PACKED_PREFIX) for b in bodies):
        return bodies
    return Resolver(fetch).resolve_bodies(bodies)
