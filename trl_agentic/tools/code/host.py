"""What the sandbox needs to know about the host: the interpreter's directories, who can read them, how many tasks
a uid runs, and a fresh uid for a worker."""

from __future__ import annotations

import functools
import json
import os
import random
import subprocess
from pathlib import Path
from typing import Iterable

from .base import SandboxError

_FRESH_UID_RANGE = (1_000_000_000, 2_000_000_000)


def fresh_uid() -> int:
    """A uid no account uses, for one worker: RLIMIT_NPROC then counts only that worker's processes, and workers
    cannot signal each other."""
    return random.SystemRandom().randrange(*_FRESH_UID_RANGE)


def count_tasks_of_uid(uid: int) -> int:
    """Number of tasks (threads included, as RLIMIT_NPROC counts them) whose real uid is ``uid``."""
    count = 0
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as fh:
                status = fh.read()
        except OSError:
            continue
        real_uid = threads = None
        for line in status.split(b"\n"):
            if line.startswith(b"Uid:"):
                real_uid = int(line.split()[1])
            elif line.startswith(b"Threads:"):
                threads = int(line.split()[1])
        if real_uid == uid:
            count += threads or 1
    return count


@functools.lru_cache(maxsize=8)
def python_dirs(executable: str) -> tuple[str, ...]:
    """Directories a sandboxed ``executable`` needs read access to (prefixes and ``sys.path``)."""
    probe = (
        "import sys, json; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]"
        " + sys.path))"
    )
    try:
        out = subprocess.run(
            [executable, "-I", "-c", probe], capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"}
        )
        paths = json.loads(out.stdout)
    except Exception as exc:  # noqa: BLE001
        raise SandboxError(f"cannot run the sandbox interpreter {executable!r}: {exc}") from exc
    paths += [os.path.dirname(executable), os.path.dirname(os.path.realpath(executable))]
    dirs: set[str] = set()
    for path in paths:
        if not path or not os.path.exists(path):
            continue
        for candidate in (os.path.abspath(path), os.path.realpath(path)):
            if candidate.endswith(".zip") or os.path.isfile(candidate):
                candidate = os.path.dirname(candidate)
            if candidate not in ("/", ""):
                dirs.add(candidate)
    return tuple(sorted(dirs))


def minimal_roots(paths: Iterable[str], already: Iterable[str] = ()) -> list[str]:
    """The shortest ``paths`` that cover all of them, leaving out those under ``already``."""
    chosen = list(already)
    out = []
    for path in sorted(set(paths), key=len):
        if any(path == root or path.startswith(root.rstrip("/") + "/") for root in chosen):
            continue
        chosen.append(path)
        out.append(path)
    return out


def readable_by_others(path: str) -> bool:
    """Every directory on the way to ``path`` is world-searchable and ``path`` world-readable."""
    try:
        parts = Path(os.path.realpath(path)).parts
        current = Path("/")
        for part in parts[1:]:
            current = current / part
            mode = current.stat().st_mode
            if current.is_dir() and not mode & 0o001:
                return False
        return bool(Path(os.path.realpath(path)).stat().st_mode & 0o004)
    except OSError:
        return False
