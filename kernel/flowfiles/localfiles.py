"""Local files that flows name (child flows, fixture files): read only when they are regular files
inside the folders allowed, and no larger than a limit.

A flow file comes from whoever wrote the flow, and its ``flow.call`` path may come from a run's input:
without these rules it could read any file on the machine, read ``/dev/zero`` without end, or hang on
a FIFO. A child flow must lie inside its calling flow's folder, fixture files inside the fixture
directory; the operator allows more folders with ``FLOWKERNEL_ALLOW_DIRS`` (paths separated by
``os.pathsep``) or the CLI's ``--allow-dir DIR``. Symlinks are followed before the check, so a link
inside the folder that points outside it is refused too.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from flowkernel.errors import InvalidInputError

ALLOW_DIRS_ENV = "FLOWKERNEL_ALLOW_DIRS"
MAX_FLOW_BYTES_ENV = "FLOWKERNEL_MAX_FLOW_BYTES"
MAX_FIXTURE_BYTES_ENV = "FLOWKERNEL_MAX_FIXTURE_BYTES"
DEFAULT_MAX_FLOW_BYTES = 10 * 1024 * 1024  # as much as the HTTP API takes in one body
DEFAULT_MAX_FIXTURE_BYTES = 100 * 1024 * 1024  # recorded transcripts can be long


def limit_from_env(name: str, default: int) -> int:
    """A byte limit from the environment (``name``), or ``default``."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInputError(f"{name}={raw!r}: must be a number of bytes") from None
    if value <= 0:
        raise InvalidInputError(f"{name}={raw!r}: must be a positive number of bytes")
    return value


def allowed_dirs() -> list[Path]:
    """The folders the operator allows beyond each flow's own (``FLOWKERNEL_ALLOW_DIRS``), resolved."""
    return [Path(p).expanduser().resolve() for p in os.environ.get(ALLOW_DIRS_ENV, "").split(os.pathsep)
            if p.strip()]


def is_inside(path: Path, roots: Iterable[Path]) -> bool:
    """Whether the resolved ``path`` lies inside (or is) one of ``roots`` (resolved)."""
    return any(path == root or path.is_relative_to(root) for root in roots)


def resolve_inside(base: Path | None, target: str, what: str,
                   error: type[InvalidInputError] = InvalidInputError) -> Path:
    """``target`` (relative to ``base``, or absolute), resolved with its symlinks; refused unless it
    lies inside ``base`` or a folder of ``FLOWKERNEL_ALLOW_DIRS``."""
    if "\0" in target:
        raise error(f"{what} {target!r}: a path cannot contain a NUL character")
    roots = allowed_dirs()
    if base is not None:
        roots.insert(0, base.resolve())
    candidate = Path(target).expanduser()
    if not candidate.is_absolute():
        if base is None:
            raise error(f"{what} {target!r}: a relative path needs a flow file's folder, and this flow was "
                        "given as a document; use an absolute path inside a folder allowed with "
                        f"--allow-dir DIR or {ALLOW_DIRS_ENV}")
        candidate = base / candidate
    try:
        resolved = candidate.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise error(f"{what} {target!r}: cannot resolve the path: {exc}") from None
    if not is_inside(resolved, roots):
        where = " or ".join(str(r) for r in roots) if roots else "no folder (none is allowed)"
        raise error(f"{what} {target!r}: {resolved} is outside {where}; files a flow names must lie in its "
                    f"folder (allow another with --allow-dir DIR or {ALLOW_DIRS_ENV})")
    return resolved


def read_limited(path: Path, limit: int, what: str, error: type[InvalidInputError] = InvalidInputError) -> bytes:
    """The bytes of the regular file ``path``, refused if it is anything else (a FIFO, a device, a
    directory) or larger than ``limit`` bytes. Never blocks on a FIFO."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not a {what}") from None
    except OSError as exc:
        raise error(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise error(f"{path}: is a directory, not a {what}")
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{path}: not a regular file ({_kind(info.st_mode)}); a {what} must be a regular file")
        if info.st_size > limit:
            raise error(f"{path}: {info.st_size} bytes, more than the {limit} a {what} may have")
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:  # it grew while we read
                raise error(f"{path}: more than the {limit} bytes a {what} may have")
        return b"".join(chunks)
    except OSError as exc:
        raise error(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a plain file"
