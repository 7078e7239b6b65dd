"""A CLI run's directories on the host (:class:`Workspace`): the working directory built from the row's files,
which outlives the run (the reward functions read it), and the scratch home, socket and ``/etc`` files, which do
not."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any, Mapping

PREFIX = "trl-agentic-cli-"


class Workspace:
    """One run's directories: ``workdir`` (the row's files; a fresh one under ``root``, or the one given), and under
    ``scratch`` the CLI's ``home``, the ``socket`` directory of its relay and its ``etc`` files. :meth:`close_scratch` removes the scratch; the working
    directory is removed by whoever holds it (:class:`~trl_agentic.cli_agents.agent.CLIResult`)."""

    def __init__(self, root: str | None = None, workdir: Path | None = None) -> None:
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix=PREFIX + "work-", dir=root))
        self.scratch = Path(tempfile.mkdtemp(prefix=PREFIX + "scratch-", dir=root))
        self.home, self.socket, self.etc = (self.scratch / name for name in ("home", "socket", "etc"))
        for directory in (self.home, self.socket, self.etc):
            directory.mkdir()

    def close_scratch(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)

    def remove(self) -> None:
        """Remove both (a run that failed before it had a result)."""
        self.close_scratch()
        shutil.rmtree(self.workdir, ignore_errors=True)


def write_files(directory: Path, files: Any) -> int:
    """Write a row's ``files`` under ``directory`` and return how many: a mapping of relative path to text, a list
    of ``{"path", "content"}`` (a dataset's form), or either as a JSON string; ``None`` entries (a dataset's
    missing keys) are skipped. A path that is absolute or leaves the directory raises ``ValueError``."""
    if isinstance(files, str):
        files = json.loads(files)
    if isinstance(files, Mapping):
        entries = list(files.items())
    elif isinstance(files, list):
        try:
            entries = [(entry["path"], entry["content"]) for entry in files]
        except (TypeError, KeyError):
            raise ValueError("files must be a mapping of path to text or a list of {'path', 'content'}") from None
    else:
        raise ValueError(f"files must be a mapping of path to text or a list of {{'path', 'content'}}, got "
                         f"{type(files).__name__}")
    written = 0
    for path, content in entries:
        if content is None:
            continue
        relative = PurePosixPath(str(path))
        if relative.is_absolute() or ".." in relative.parts or not relative.parts:
            raise ValueError(f"a file's path must be relative and stay inside the working directory, got {path!r}")
        target = directory.joinpath(*relative.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(str(content), encoding="utf-8")
        written += 1
    return written
