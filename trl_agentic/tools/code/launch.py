"""How a worker process is started: the :class:`LaunchSpec` every worker of a sandbox shares, built from the
sandbox's options by :func:`plan_launch`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .isolation import SandboxIsolation, UidPlan, plan_isolation


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one worker (see :class:`~.worker.Worker`).

    Attributes:
        backend: ``"bwrap"`` or ``"subprocess"``.
        python: The interpreter run in the sandbox.
        limits: Resource limits the worker sets on itself (``as_bytes``, ``fsize_bytes``, ``nofile``,
            ``cpu_seconds``, ``session_cpu_seconds``).
        output_bytes: Head and tail kept of each block's Python-level output, and of each stream read by the parent.
        tmpfs_bytes: Size of each private tmpfs (bwrap).
        env: The program's environment.
        preimport: Modules imported into every session's globals.
        extra_ro_binds: ``(host_path, sandbox_path)`` read-only mounts (bwrap).
        uid: Which uid the worker switches to (root trainer only).
        unshare_prefix: The fallback's ``unshare`` command, or ``()``.
        pid_namespace: The worker is PID 1 of its own PID namespace, or its child.
        nproc_extra: Processes the worker's uid may start (None: no RLIMIT_NPROC).
        count_uid: The uid whose existing tasks count against RLIMIT_NPROC (caller's uid), or None.
        startup_timeout: Seconds allowed for a worker to start.
    """

    backend: str
    python: str
    limits: dict[str, Any]
    output_bytes: int
    tmpfs_bytes: int
    env: dict[str, str]
    preimport: tuple[str, ...]
    extra_ro_binds: tuple[tuple[str, str], ...]
    uid: UidPlan
    unshare_prefix: tuple[str, ...]
    pid_namespace: bool
    nproc_extra: int | None
    count_uid: int | None
    startup_timeout: float


def sandbox_env(python: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The program's environment: a fixed minimal one (``PATH`` with the interpreter's directory first, a UTF-8
    locale, one thread per numerical library, a headless matplotlib) plus ``env``; never the trainer's."""
    base = {
        "PATH": os.pathsep.join(dict.fromkeys([os.path.dirname(python), "/usr/local/bin", "/usr/bin", "/bin"])),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "NUMEXPR_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
    }
    if env:
        base.update({str(k): str(v) for k, v in env.items()})
    return base


@dataclass(frozen=True)
class WorkerOptions:
    """The settings every worker of a sandbox gets; each is the :class:`~.sandbox.PythonSandbox` argument of the
    same name (defaults: those of a probe sandbox)."""

    cpu_time: float = 10.0
    session_cpu_time: float = 300.0
    memory_mb: int = 1024
    max_processes: int = 32
    max_file_size_mb: int = 64
    tmpfs_size_mb: int = 64
    max_open_files: int = 256
    max_output_chars: int = 4000
    env: Mapping[str, str] | None = None
    preimport: Sequence[str] = ()
    extra_ro_binds: Sequence[tuple[str, str]] = ()
    sandbox_uid: int | None = None
    startup_timeout: float = 30.0


def plan_launch(
    backend: str,
    python: str,
    options: WorkerOptions,
    *,
    unshare_prefix: tuple[str, ...] = (),
    fallback_reason: str = "",
) -> tuple[LaunchSpec, SandboxIsolation]:
    """The launch spec of ``backend``'s workers and what they isolate."""
    isolation, uid = plan_isolation(
        backend,
        python,
        unshare_prefix=unshare_prefix,
        sandbox_uid=options.sandbox_uid,
        max_processes=options.max_processes,
        fallback_reason=fallback_reason,
    )
    limits = {
        "as_bytes": options.memory_mb << 20 if options.memory_mb > 0 else None,
        "fsize_bytes": int(options.max_file_size_mb) << 20,
        "nofile": int(options.max_open_files),
        "cpu_seconds": max(1, int(round(options.cpu_time))),
        "session_cpu_seconds": max(1, int(round(options.session_cpu_time))),
    }
    spec = LaunchSpec(
        backend=backend,
        python=python,
        limits=limits,
        output_bytes=max(4096, 4 * int(options.max_output_chars)),
        tmpfs_bytes=int(options.tmpfs_size_mb) << 20,
        env=sandbox_env(python, options.env),
        preimport=tuple(options.preimport),
        extra_ro_binds=tuple((str(a), str(b)) for a, b in options.extra_ro_binds),
        uid=uid,
        unshare_prefix=unshare_prefix,
        pid_namespace=isolation.pid_namespace,
        nproc_extra=options.max_processes if isolation.process_limit else None,
        count_uid=isolation.uid if isolation.process_limit else None,
        startup_timeout=float(options.startup_timeout),
    )
    return spec, isolation
