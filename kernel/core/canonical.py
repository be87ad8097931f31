"""The canonical form of a flow document, and the content address it is stored under."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def flow_hash(canonical: str) -> str:
    """Content address of a flow definition: sha256 of its canonical JSON (``canonical_json``)."""
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
