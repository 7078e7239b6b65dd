"""A command run in a :class:`~trl_agentic.cli_agents.workspace.Workspace`, sandboxed or not, within
:class:`RunBounds` (:func:`launch`): a CLI agent's run, and the commands its reward runs afterwards in the directory
it left (:func:`run_command`, e.g. the row's tests), in the same confinement."""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from .process import Finished, run_launched
from .relay import Relay
from .sandbox import HOME, SOCKET_DIR, WORKDIR, choose_sandbox, sandbox_prefix, write_identity
from .workspace import Workspace

SOCKET = "endpoint.sock"
PYTHON = sys._base_executable
"""The interpreter the launcher runs with (the one behind a virtual environment): only its standard library is read,
so only its installation is bound into the sandbox."""


@dataclass(frozen=True)
class RunBounds:
    """What one run may take: ``timeout`` wall-clock seconds, ``max_output_bytes`` of output in all (past either it
    is stopped: :class:`~trl_agentic.cli_agents.process.CLIRunError`), ``max_file_size_mb`` per file
    (``RLIMIT_FSIZE``); ``keep_output_bytes`` of each stream's head and tail are kept."""

    timeout: float = 600.0
    max_output_bytes: int = 16 << 20
    keep_output_bytes: int = 16384
    max_file_size_mb: int = 256


def seen_paths(workspace: Workspace, sandboxed: bool) -> tuple[str, str]:
    """The working directory and home as the command sees them (fixed paths inside the sandbox)."""
    return (WORKDIR, HOME) if sandboxed else (str(workspace.workdir), str(workspace.home))


async def launch(workspace: Workspace, argv: Sequence[str], env: Mapping[str, str], sandboxed: bool,
                 bounds: RunBounds, name: str, installation: Sequence[str] = (), endpoint_port: int | None = None,
                 path: Sequence[str] = ()) -> Finished:
    """Run ``argv`` in ``workspace`` (its working directory current, its home ``HOME``) with ``env`` over a cleared
    environment, under bubblewrap when ``sandboxed`` (``installation`` and the launcher's Python read-only), with the
    endpoint's ``endpoint_port`` relayed into the sandbox when given; ``path`` goes first on ``PATH``."""
    workdir, home = seen_paths(workspace, sandboxed)
    base = {"PATH": ":".join([*path, "/usr/local/bin", "/usr/bin", "/bin"]), "HOME": home, "TMPDIR": "/tmp",
            "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "dumb", "NO_COLOR": "1"}
    relayed = sandboxed and endpoint_port is not None
    config = {"argv": [str(a) for a in argv], "env": {**base, **{str(k): str(v) for k, v in env.items()}},
              "cwd": workdir, "limits": {"RLIMIT_FSIZE": bounds.max_file_size_mb << 20, "RLIMIT_CORE": 0},
              "relay": {"port": endpoint_port, "socket": f"{SOCKET_DIR}/{SOCKET}"} if relayed else None}
    prefix: list[str] = []
    relay = Relay(workspace.socket / SOCKET, endpoint_port) if relayed else None
    try:
        if relay is not None:
            await relay.start()
        if sandboxed:
            prefix = sandbox_prefix(workspace.workdir, workspace.home, workspace.socket, write_identity(workspace.etc),
                                    [*installation, sys.base_prefix, sys.base_exec_prefix])
        return await run_launched(prefix, PYTHON, config, str(workspace.workdir), bounds.timeout,
                                  bounds.max_output_bytes, bounds.keep_output_bytes, name)
    finally:
        if relay is not None:
            await relay.close()


def run_command(argv: Sequence[str], workdir: str | Path, *, sandbox: str = "auto", timeout: float = 60.0,
                installation: Sequence[str] = (), env: Mapping[str, str] | None = None,
                name: str = "the command") -> Finished:
    """Run ``argv`` in an existing ``workdir`` (a CLI run's, after it ended) as a CLI run is confined (``sandbox``:
    ``"auto"``, ``"bwrap"`` or ``"none"``; no network under bubblewrap), within ``timeout`` seconds; from any
    thread, a running event loop's included (a reward function's). :class:`~trl_agentic.cli_agents.process
    .CLIRunError` when it is stopped."""
    sandboxed = choose_sandbox(sandbox)
    workspace = Workspace(workdir=Path(workdir))
    try:
        coroutine = launch(workspace, argv, env or {}, sandboxed, RunBounds(timeout=timeout), name, installation)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, coroutine).result()
    finally:
        workspace.close_scratch()
