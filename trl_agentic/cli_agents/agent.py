"""``agent=`` a command line (:class:`CLIAgent`): each trajectory runs the CLI as a child process in a fresh working
directory built from its row, pointed at the trajectory's own base URL and key, sandboxed, bounded, and ended whole;
reward functions receive a :class:`CLIResult` as ``agent_output``."""

from __future__ import annotations

import asyncio
import shutil
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from .launch import RunBounds, launch, seen_paths
from .process import last_line
from .sandbox import choose_sandbox
from .workspace import Workspace, write_files


@dataclass(frozen=True)
class CLIRun:
    """What one trajectory's CLI is given, as the CLI sees it (paths inside the sandbox when there is one).

    Attributes:
        task: The row's ``task``.
        workdir: Its working directory (the row's files), its current directory.
        home: Its home directory (scratch, gone after the run).
        base_url: The trajectory's OpenAI-compatible base URL (``http://127.0.0.1:<port>/t/<key>/v1``).
        api_key: The trajectory's key.
        model: A model name the endpoint serves.
        headers: HTTP headers to send with each request: they prove that this trajectory's CLI sent it, so that it
            may open several conversations (an auxiliary call, a compacted history; :mod:`~trl_agentic.agents
            .ownership`).
    """

    task: str
    workdir: str
    home: str
    base_url: str
    api_key: str
    model: str
    headers: Mapping[str, str]

    @property
    def root_url(self) -> str:
        """The base URL without ``/v1``, for clients that append ``/v1/...`` themselves (Anthropic's)."""
        return self.base_url.removesuffix("/v1")


@dataclass(frozen=True, eq=False)
class CLIResult:
    """What a CLI run left, as reward functions receive it (``agent_output``).

    The working directory stays on disk as long as this object (or one of its references: the trajectory that
    holds it) does, and is removed when it is garbage-collected (or at exit).

    Attributes:
        workdir: The run's working directory on this machine, as the CLI left it.
        exit_code: The CLI's exit status (``128 + n`` when signal ``n`` killed it).
        stdout: What it wrote on its standard output (head and tail when long).
        stderr: What it wrote on its standard error (head and tail when long).
        seconds: The run's wall-clock time.
    """

    workdir: str
    exit_code: int
    stdout: str
    stderr: str
    seconds: float

    def __post_init__(self) -> None:
        weakref.finalize(self, shutil.rmtree, self.workdir, True)


class CLIAgentError(RuntimeError):
    """A CLI run that cannot count as an attempt at its task: it got no model reply and exited non-zero."""


@dataclass
class CLIAgent:
    """A command-line agent, for ``agent=`` of both trainers and ``evaluate``; see :mod:`trl_agentic.cli_agents`.

    Each row needs a ``task`` column (the text the CLI is given) and may have ``files`` (the working directory's
    files: a mapping of relative path to text, or a list of ``{"path", "content"}``).

    Args:
        command: ``command(run)`` -> the argv of one run (:class:`CLIRun`).
        env: ``env(run)`` -> the CLI's environment variables (the environment is otherwise cleared: ``PATH``,
            ``HOME``, ``TMPDIR``, ``LANG`` are set).
        home_files: ``home_files(run)`` -> text files to write under the CLI's home before it starts (its config).
        installation: Host paths the CLI needs to read (its package, its interpreter), bound read-only into the
            sandbox; the launcher's own Python installation is added.
        name: How messages name the CLI.
        timeout: Wall-clock bound of one run, in seconds; past it the run is ended and its trajectory fails.
        sandbox: ``"auto"`` (bubblewrap when it works here, else none), ``"bwrap"`` (refused when it does not), or
            ``"none"`` (:mod:`~trl_agentic.cli_agents.sandbox`).
        max_output_bytes: A run that writes more (stdout and stderr together) is ended and its trajectory fails.
        keep_output_bytes: The head and tail of each stream kept in :class:`CLIResult`.
        max_file_size_mb: ``RLIMIT_FSIZE`` of every process of the run.
        path: Directories put first on the CLI's ``PATH`` (inside the sandbox, at the same paths).
        workspace_root: Where the runs' directories are made (default: the system's temporary directory).
    """

    command: Callable[[CLIRun], Sequence[str]]
    env: Callable[[CLIRun], Mapping[str, str]] | None = None
    home_files: Callable[[CLIRun], Mapping[str, str]] | None = None
    installation: Sequence[str] = ()
    name: str = "the CLI"
    timeout: float = 600.0
    sandbox: str = "auto"
    max_output_bytes: int = 16 << 20
    keep_output_bytes: int = 16384
    max_file_size_mb: int = 256
    path: Sequence[str] = ()
    workspace_root: str | None = None

    def __post_init__(self) -> None:
        if not callable(self.command):
            raise TypeError(f"command must be a function command(run) -> argv, got {type(self.command).__name__}")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout!r}")
        self._sandboxed: bool | None = None

    def sandboxed(self) -> bool:
        """Whether runs go under bubblewrap (decided once; :func:`~trl_agentic.cli_agents.sandbox.choose_sandbox`)."""
        if self._sandboxed is None:
            self._sandboxed = choose_sandbox(self.sandbox)
        return self._sandboxed

    async def __call__(self, endpoint: Any, task: str, files: Any = None, **row: Any) -> CLIResult:
        """One run for one row (the agent function ``agent=`` calls with the trajectory's endpoint)."""
        sandboxed = await asyncio.to_thread(self.sandboxed)  # file work off the agents' loop, as below
        workspace = await asyncio.to_thread(Workspace, self.workspace_root)
        try:
            if files is not None:
                await asyncio.to_thread(write_files, workspace.workdir, files)
            run = CLIRun(str(task), *seen_paths(workspace, sandboxed), endpoint.base_url, endpoint.api_key,
                         endpoint.model, dict(endpoint.headers))
            write_files(workspace.home, dict(self.home_files(run)) if self.home_files else {})
            bounds = RunBounds(self.timeout, self.max_output_bytes, self.keep_output_bytes, self.max_file_size_mb)
            finished = await launch(workspace, self.command(run), self.env(run) if self.env else {}, sandboxed,
                                    bounds, self.name, self.installation, _port(endpoint.base_url), self.path)
        except BaseException:
            await asyncio.shield(asyncio.to_thread(workspace.remove))
            raise
        await asyncio.to_thread(workspace.close_scratch)
        if finished.exit_code != 0 and endpoint.model_replies() == 0:
            await asyncio.to_thread(shutil.rmtree, workspace.workdir, True)
            raise CLIAgentError(f"{self.name} exited with status {finished.exit_code} without a model reply; its "
                                f"last output: {last_line(finished.stderr, finished.stdout)}")
        return CLIResult(str(workspace.workdir), finished.exit_code, finished.stdout, finished.stderr,
                         finished.seconds)


def _port(base_url: str) -> int:
    """The port of ``http://127.0.0.1:<port>/...``."""
    return int(base_url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
