"""The local code-interpreter tool (:class:`PythonSandbox`): options, backend choice, and a pool of workers."""

from __future__ import annotations

import sys
from typing import Mapping, Sequence

from . import backends
from .base import CodeSandbox, SandboxError
from .isolation import warn_fallback
from .launch import WorkerOptions, plan_launch
from .pool import Pool
from .session import PythonSession
from .worker import Worker


class PythonSandbox(CodeSandbox):
    """A local code-interpreter tool with per-trajectory sessions (see :mod:`trl_agentic.tools.code` and
    ``docs/tools.md`` for what each backend isolates).

    Args:
        backend: ``"auto"`` (bubblewrap when it works here, else the subprocess fallback with a warning),
            ``"bwrap"`` (raise :class:`SandboxError` if it does not work) or ``"subprocess"``.
        timeout: Wall-time limit per code block, seconds. On expiry the worker is killed and restarted.
        cpu_time: CPU-time limit per block, seconds (default: ``timeout``): the CPU time of all the sandbox's
            processes and threads together, counted by the parent, which kills the worker past it.
        session_cpu_time: Hard CPU-time cap (``RLIMIT_CPU``) of each process of a session (default
            ``max(60, 30 * cpu_time)``).
        memory_mb: Address-space limit (``RLIMIT_AS``) of the worker and of each process it starts; memory that
            ``RLIMIT_AS`` would not count (memfd, SysV shared memory and message queues) is refused.
        max_processes: How many more processes/threads the worker's uid may have (``RLIMIT_NPROC``, non-root).
        max_file_size_mb: Largest file the program may write.
        tmpfs_size_mb: Size of each private tmpfs (``/workdir`` and ``/tmp``) in bubblewrap mode.
        max_open_files: ``RLIMIT_NOFILE``.
        max_output_chars: Observation size limit (head and tail kept); also bounds what the worker sends.
        max_read_bytes: The parent kills a program that writes more than this to its file descriptors in a block.
        max_code_chars: Longer code is refused with an error text.
        traceback_lines: Only the last lines of a traceback are shown.
        pool_size: Pre-started workers kept ready (0: start one per session, "cold").
        python: Interpreter to run in the sandbox (default: this one). Its prefix and ``sys.path`` are mounted
            read-only, so installed packages (numpy, sympy...) can be imported.
        env: Extra environment variables for the program (the trainer's own environment is never passed).
        preimport: Modules imported into every session's globals at start-up (e.g. ``("math", "numpy")``).
        extra_ro_binds: ``(host_path, sandbox_path)`` pairs mounted read-only (bubblewrap mode).
        sandbox_uid: Uid/gid the worker switches to when the trainer runs as root. None (default): a fresh unused
            uid per worker (from 1e9 to 2e9), so that ``max_processes`` counts only that worker's processes and
            workers cannot signal each other. Ignored when the trainer is not root (the worker keeps its uid).
        startup_timeout: Seconds allowed for a worker to start.
    """

    def __init__(
        self,
        *,
        backend: str = "auto",
        timeout: float = 10.0,
        cpu_time: float | None = None,
        session_cpu_time: float | None = None,
        memory_mb: int = 1024,
        max_processes: int = 32,
        max_file_size_mb: int = 64,
        tmpfs_size_mb: int = 64,
        max_open_files: int = 256,
        max_output_chars: int = 4000,
        max_read_bytes: int = 32 << 20,
        max_code_chars: int = 200_000,
        traceback_lines: int = 20,
        pool_size: int = 2,
        python: str | None = None,
        env: Mapping[str, str] | None = None,
        preimport: Sequence[str] = (),
        extra_ro_binds: Sequence[tuple[str, str]] = (),
        sandbox_uid: int | None = None,
        startup_timeout: float = 30.0,
    ):
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.timeout = float(timeout)
        self.cpu_time = float(cpu_time) if cpu_time is not None else self.timeout
        self.session_cpu_time = (
            float(session_cpu_time) if session_cpu_time is not None else max(60.0, 30.0 * self.cpu_time)
        )
        self.memory_mb = int(memory_mb)
        self.max_processes = int(max_processes)
        self.max_output_chars = int(max_output_chars)
        self.max_read_bytes = int(max_read_bytes)
        self.max_code_chars = int(max_code_chars)
        self.traceback_lines = int(traceback_lines)
        self.python = python or sys.executable
        self._closed = False
        self.backend, reason = backends.choose_backend(backend, self.python)
        options = WorkerOptions(
            cpu_time=self.cpu_time, session_cpu_time=self.session_cpu_time, memory_mb=self.memory_mb,
            max_processes=self.max_processes, max_file_size_mb=max_file_size_mb, tmpfs_size_mb=tmpfs_size_mb,
            max_open_files=max_open_files, max_output_chars=self.max_output_chars, env=env, preimport=preimport,
            extra_ro_binds=extra_ro_binds, sandbox_uid=sandbox_uid, startup_timeout=startup_timeout,
        )
        unshare_prefix = backends.probe_unshare() if self.backend == "subprocess" else ()
        spec, self.isolation = plan_launch(
            self.backend, self.python, options, unshare_prefix=unshare_prefix, fallback_reason=reason
        )
        if self.backend == "subprocess" and backend == "auto":
            warn_fallback(self.isolation)
        self._pool = Pool(spec, pool_size)

    def _acquire_worker(self) -> Worker:  # handed to each session: the pool stays the sandbox's
        if self._closed:
            raise SandboxError("this PythonSandbox is closed")
        return self._pool.acquire()

    def session(self) -> PythonSession:
        """A new interpreter whose state persists across calls; ``close()`` it when the trajectory ends."""
        return PythonSession(self, lambda: self._acquire_worker())

    def close(self) -> None:
        """Stop the pool (idle workers are killed). Open sessions keep their worker until closed."""
        self._closed = True
        self._pool.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self._pool.close()
        except Exception:  # noqa: BLE001
            pass

    def __repr__(self) -> str:
        return (
            f"PythonSandbox(backend={self.backend!r}, timeout={self.timeout:g}, memory_mb={self.memory_mb}, "
            f"pool_size={self._pool.size})"
        )
