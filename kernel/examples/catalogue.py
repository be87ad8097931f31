"""The examples that ship with flowkernel: which they are, how to run them, and copying them out.

The catalogue is read from the flow files themselves: an example is a flow in
``flowkernel.examples.flows`` that no other example calls (``subflow-writer`` is part of ``subflow``);
its line is the flow's ``description``; the inputs of its command are the flow's required inputs,
each with the first of its JSON Schema ``examples``; its fixtures are ``fixtures/<name>/`` when they
exist. Only the plugin a flow needs is said here: a flow file never names code to import.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path, PurePosixPath
from typing import Any

from flowkernel.errors import InvalidInputError

FLOWS = "flowkernel.examples.flows"
FIXTURES = "flowkernel.examples.fixtures"

# The tools and functions an example needs, by flow name: the operator loads them with --plugin.
PLUGINS: dict[str, tuple[str, ...]] = {"research": ("flowkernel.examples.research_tools",),
                                       "fix-test": ("flowkernel.examples.fix_test_tools",)}


@dataclass(frozen=True, slots=True)
class Example:
    """One example flow, as ``flowkernel examples`` lists it."""

    name: str
    description: str
    flow: str  # relative to a folder made by ``copy_examples``, e.g. ``flows/review-loop.json``
    fixtures: str | None  # likewise, e.g. ``fixtures/review-loop``; None when it makes no model calls
    inputs: dict[str, Any] = field(default_factory=dict)
    plugins: tuple[str, ...] = ()
    waits_for_reply: bool = False
    extras: tuple[str, ...] = ()  # the optional dependencies its node types need (pip install 'flowkernel[X]')

    @property
    def command(self) -> str:
        """The shell command that runs it from a folder made by ``copy_examples``."""
        q = shlex.quote
        words = ["flowkernel", *(f"--plugin {q(p)}" for p in self.plugins), "run", q(self.flow)]
        for key, value in self.inputs.items():
            text = value if isinstance(value, str) else json.dumps(value)
            # key='a value' reads like the README's key="a value"; an odd key is quoted whole
            pair = f"{key}={q(text)}" if q(key) == key else q(f"{key}={text}")
            words.append(f"--input {pair}")
        if self.fixtures:
            words.append(f"--fixtures {q(self.fixtures)}")
        return " ".join(words)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "flow": self.flow, "fixtures": self.fixtures,
                "inputs": self.inputs, "plugins": list(self.plugins), "waitsForReply": self.waits_for_reply,
                "extras": list(self.extras),
                "command": self.command}


def _flow_files() -> dict[str, Traversable]:
    return {entry.name: entry for entry in files(FLOWS).iterdir()
            if entry.is_file() and entry.name.endswith(".json")}


def _fixture_dirs() -> dict[str, list[Traversable]]:
    found: dict[str, list[Traversable]] = {}
    for folder in files(FIXTURES).iterdir():
        if folder.is_dir():
            names = [f for f in folder.iterdir() if f.is_file() and f.name.endswith(".json")]
            if names:
                found[folder.name] = sorted(names, key=lambda f: f.name)
    return found


def _called_flows(document: dict[str, Any]) -> set[str]:
    """File names of the flows a flow calls (``flow.call`` nodes with a constant ``flow``)."""
    called = set()
    for node in document.get("nodes") or []:
        target = (node.get("input") or {}).get("flow") if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get("type") == "flow.call" and isinstance(target, str) \
                and "{{" not in target:
            called.add(PurePosixPath(target).name)
    return called


def _example_inputs(document: dict[str, Any]) -> dict[str, Any]:
    schema = document.get("inputs") or {}
    props = schema.get("properties") or {}
    out: dict[str, Any] = {}
    for key in schema.get("required") or []:
        samples = (props.get(key) or {}).get("examples")
        out[key] = samples[0] if isinstance(samples, list) and samples else "VALUE"
    return out


def _waits(document: dict[str, Any]) -> bool:
    for node in document.get("nodes") or []:
        if node.get("type") == "human.input" or "ask_human" in ((node.get("input") or {}).get("tools") or []):
            return True
    return False


def list_examples() -> list[Example]:
    """The shipped examples, sorted by name."""
    documents = {file_name: json.loads(entry.read_text(encoding="utf-8"))
                 for file_name, entry in _flow_files().items()}
    called = set().union(*(_called_flows(d) for d in documents.values())) if documents else set()
    fixtures = _fixture_dirs()
    examples = []
    for file_name, doc in sorted(documents.items()):
        if file_name in called:
            continue
        name = str(doc.get("name") or file_name.removesuffix(".json"))
        stem = file_name.removesuffix(".json")
        examples.append(Example(
            name=name, description=str(doc.get("description") or ""), flow=f"flows/{file_name}",
            fixtures=f"fixtures/{stem}" if stem in fixtures else None, inputs=_example_inputs(doc),
            plugins=PLUGINS.get(name, ()), waits_for_reply=_waits(doc), extras=_extras(doc)))
    return examples


# Node types that need an optional dependency, by the extra that installs it.
_EXTRA_OF = {"claude.code": "claude-code"}


def _extras(document: dict[str, Any]) -> tuple[str, ...]:
    types = {node.get("type") for node in document.get("nodes") or [] if isinstance(node, dict)}
    return tuple(sorted({extra for kind, extra in _EXTRA_OF.items() if kind in types}))


def _shipped_files() -> Iterator[tuple[PurePosixPath, Traversable]]:
    """Every file ``copy_examples`` writes, by its path relative to the destination."""
    for file_name, entry in sorted(_flow_files().items()):
        yield PurePosixPath("flows", file_name), entry
    for folder, entries in sorted(_fixture_dirs().items()):
        for entry in entries:
            yield PurePosixPath("fixtures", folder, entry.name), entry


def copy_examples(destination: str | Path, *, force: bool = False) -> list[Path]:
    """Write ``DIR/flows/*.json`` and ``DIR/fixtures/<name>/*.json``; returns the paths written.

    A destination that is not empty is refused unless ``force`` (which overwrites the example files
    and leaves every other file alone), naming the first file in the way.
    """
    root = Path(destination)
    if root.exists() and not root.is_dir():
        raise InvalidInputError(f"{root}: exists and is not a directory; name a new or empty directory")
    planned = list(_shipped_files())
    if root.is_dir() and not force:
        clashes = [root / rel for rel, _ in planned if (root / rel).exists()]
        try:
            present = sorted(root.iterdir())
        except OSError as exc:
            raise InvalidInputError(f"{root}: cannot read the directory: {exc.strerror or exc}") from None
        in_the_way = clashes[0] if clashes else present[0] if present else None
        if in_the_way is not None:
            raise InvalidInputError(f"{root}: not empty ({in_the_way} is in the way); choose an empty directory, "
                                    "or pass --force to overwrite the example files in it")
    written = []
    for rel, entry in planned:
        target = root.joinpath(*rel.parts)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(entry.read_bytes())
        except OSError as exc:
            raise InvalidInputError(f"{target}: cannot write: {exc.strerror or exc}") from None
        written.append(target)
    return written
