"""One CLI run as a child process tree: started through the launcher (:mod:`~trl_agentic.cli_agents.launcher`),
its output kept within bounds, under a wall-clock bound, and ended whole whatever happens (:func:`run_launched`).

Each output stream keeps its first and last ``keep_bytes`` (``[... N bytes truncated ...]`` between); a run whose
streams carry more than ``max_output_bytes`` in all is stopped (a CLI that floods its output costs its trajectory,
not the trainer's memory or CPU). Ending a run: ``SIGTERM`` to the launcher, which stops and kills every process
under it (under bubblewrap, the outer ``bwrap`` dies and its PID namespace with it), then ``SIGKILL`` to the
launcher's process group after :data:`GRACE_S`. A cancelled run (the agent's ``env_timeout``) is ended the same
way before the cancellation goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..tools.code.protocol import ByteHeadTail

LAUNCHER = (Path(__file__).parent / "launcher.py").read_text(encoding="utf-8")
GRACE_S = 2.0
"""How long an ended launcher has to stop its processes before its process group is killed."""
DRAIN_S = 5.0
"""How long the output is read after the launcher exited (every writer is gone by then)."""
CHUNK = 65536


class CLIRunError(RuntimeError):
    """A CLI run that was stopped: past its wall-clock bound, over its output bound, or it could not start."""


@dataclass(frozen=True)
class Finished:
    """How a run ended: its exit status (``128 + n`` when signal ``n`` killed the CLI), its kept output, seconds."""

    exit_code: int
    stdout: str
    stderr: str
    seconds: float


async def run_launched(prefix: Sequence[str], python: str, config: Mapping[str, Any], cwd: str,
                       timeout: float, max_output_bytes: int, keep_bytes: int, name: str) -> Finished:
    """Run the launcher with ``config`` (``argv``, ``env``, ``cwd``, ``limits``, ``relay``) after ``prefix`` (the
    sandbox's command, or nothing) and wait for it within ``timeout`` seconds; :class:`CLIRunError` when it is
    stopped (module docstring). ``name`` names the CLI in messages."""
    argv = [*prefix, python, "-I", "-S", "-c", LAUNCHER, json.dumps(dict(config))]
    start = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL, cwd=cwd,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                    env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                                                    start_new_session=True)
    except OSError as exc:
        raise CLIRunError(f"{name} could not start: {exc}") from None
    out, err = ByteHeadTail(keep_bytes), ByteHeadTail(keep_bytes)
    flooded = asyncio.Event()

    async def read(stream: asyncio.StreamReader, sink: ByteHeadTail) -> None:
        while data := await stream.read(CHUNK):
            sink.feed(data)
            if out.total + err.total > max_output_bytes:
                flooded.set()
                return

    readers = [asyncio.ensure_future(read(proc.stdout, out)), asyncio.ensure_future(read(proc.stderr, err))]
    exited, flood = asyncio.ensure_future(proc.wait()), asyncio.ensure_future(flooded.wait())
    try:
        await asyncio.wait([exited, flood], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if not exited.done():
            await _end(proc)
            reason = (f"wrote over max_output_bytes={max_output_bytes} bytes of output" if flooded.is_set()
                      else f"ran past its wall-clock bound of {timeout:g} s")
            raise CLIRunError(f"{name} {reason} and was stopped; its last output: {last_line(err.text()[0], out.text()[0])}")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*readers), DRAIN_S)
    except asyncio.CancelledError:
        await asyncio.shield(_end(proc))
        raise
    finally:
        for task in (*readers, exited, flood):
            task.cancel()
    return Finished(proc.returncode, out.text()[0], err.text()[0], time.monotonic() - start)


async def _end(proc: asyncio.subprocess.Process) -> None:
    """End the launcher and everything under it (module docstring)."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), GRACE_S)
    except asyncio.TimeoutError:
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()


def last_line(*texts: str) -> str:
    """The last non-empty line of the first of ``texts`` that has one, shortened: for one-line messages."""
    for text in texts:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if lines:
            return lines[-1][:300]
    return "(none)"
