"""Flow files on disk: reading a JSON (or YAML) document and its content address. No pydantic here:
resuming a stored run needs neither validation nor its import cost."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from flowkernel.errors import FlowFileError


def read_flow_document(path: Path) -> tuple[dict[str, Any], str]:
    """Read a flow file as a JSON (or YAML) document; returns the document and its text."""
    if not path.exists():
        raise FlowFileError(f"{path}: no such flow file")
    if path.is_dir():
        raise FlowFileError(f"{path}: is a directory, not a flow file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FlowFileError(f"{path}: cannot read: {exc}") from None
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise FlowFileError(f"{path}: YAML flows need PyYAML (pip install pyyaml)") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise FlowFileError(f"{path}: not valid YAML: {exc}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise FlowFileError(
                f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
    return data, text


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def flow_hash(canonical: str) -> str:
    """Content address of a flow definition: sha256 of its canonical JSON (``canonical_json``)."""
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
