"""What a backend guarantees on the machine at hand (:class:`SandboxIsolation`), which uid the worker runs as, and
the warning given once when the unisolated fallback is chosen automatically."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

from .host import python_dirs, readable_by_others

_WARNED_FALLBACK = False


@dataclass(frozen=True)
class SandboxIsolation:
    """What the chosen backend guarantees here (tests and logs read it; the docs explain each line).

    Attributes:
        backend: ``"bwrap"`` or ``"subprocess"``.
        network: The program has no network (its own network namespace).
        filesystem: The program sees only read-only system and Python directories plus private tmpfs work dirs.
        pid_namespace: The program sees only its own processes; all of them die with the session.
        ipc_namespace: SysV IPC objects (semaphores; shared memory and message queues are refused anyway) live in
            the sandbox's own IPC namespace and die with it.
        uid: Real uid the program runs as (outside any user namespace); None: a fresh unused uid per worker.
        root: The program runs as uid 0 (then RLIMIT_NPROC is ignored by the kernel and files are not protected).
        process_limit: ``max_processes`` is enforced (RLIMIT_NPROC applies to non-root uids only).
        environment: The trainer's environment variables are not visible (always True: the env is cleared).
        notes: Human-readable caveats.
    """

    backend: str
    network: bool
    filesystem: bool
    pid_namespace: bool
    ipc_namespace: bool
    uid: int | None
    root: bool
    process_limit: bool
    environment: bool = True
    notes: tuple[str, ...] = ()

    def not_isolated(self) -> list[str]:
        """What is *not* isolated, in words."""
        missing = []
        if not self.filesystem:
            who = "root" if self.root else (f"uid {self.uid}" if self.uid is not None else "its unprivileged uid")
            missing.append(f"filesystem (the program can read and write whatever {who} can)")
        if not self.network:
            missing.append("network (the program can open connections, including to 127.0.0.1)")
        if not self.ipc_namespace:
            missing.append("SysV IPC (the program shares the host's semaphores)")
        if not self.pid_namespace:
            missing.append(
                "processes (the program sees other processes, can signal those of its uid, and children that "
                "call setsid may outlive the session)"
            )
        if not self.process_limit:
            missing.append(
                "process count (RLIMIT_NPROC does not apply to root: a fork bomb is only stopped by the timeout)"
            )
        return missing


@dataclass(frozen=True)
class UidPlan:
    """Which uid a worker switches to before running code (only when the trainer is root).

    Attributes:
        drop_to_uid: A fixed uid/gid (``sandbox_uid``), or None.
        fresh_uid: Draw a fresh unused uid per worker.
    """

    drop_to_uid: int | None = None
    fresh_uid: bool = False


def plan_isolation(
    backend: str,
    python: str,
    *,
    unshare_prefix: tuple[str, ...] = (),
    sandbox_uid: int | None = None,
    max_processes: int = 32,
    fallback_reason: str = "",
) -> tuple[SandboxIsolation, UidPlan]:
    """What ``backend`` isolates here, and the uid its workers run as.

    A root trainer's workers switch to ``sandbox_uid`` or a fresh unused uid; in the subprocess fallback only when
    the Python installation is readable by other users (else the worker could not start, and it stays root). A
    non-root trainer's workers keep its uid. ``unshare_prefix`` is the fallback's ``unshare`` command (network and
    PID namespaces when they work here).
    """
    root = os.geteuid() == 0
    notes: list[str] = []
    switch_uid = root
    if backend == "bwrap":
        pid_ns = ipc_ns = network = filesystem = True
    else:
        pid_ns = "--pid" in unshare_prefix
        ipc_ns = "--ipc" in unshare_prefix
        network = "--net" in unshare_prefix
        filesystem = False
        if root and not all(readable_by_others(p) for p in python_dirs(python)):
            switch_uid = False
            notes.append(
                "running as root: the worker cannot switch to an unprivileged uid because the Python "
                "installation is not readable by other users"
            )
        if fallback_reason:
            notes.append(fallback_reason)
    plan = UidPlan()
    if switch_uid:
        plan = UidPlan(drop_to_uid=int(sandbox_uid)) if sandbox_uid is not None else UidPlan(fresh_uid=True)
    effective_uid = plan.drop_to_uid if plan.drop_to_uid is not None else (None if plan.fresh_uid else os.getuid())
    runs_as_root = effective_uid == 0
    isolation = SandboxIsolation(
        backend=backend,
        network=network,
        filesystem=filesystem,
        pid_namespace=pid_ns,
        ipc_namespace=ipc_ns,
        uid=effective_uid,
        root=runs_as_root,
        process_limit=not runs_as_root and max_processes > 0,
        notes=tuple(notes),
    )
    return isolation, plan


def warn_fallback(isolation: SandboxIsolation) -> None:
    """Warn once per process that the unisolated fallback is in use, naming what it does not isolate."""
    global _WARNED_FALLBACK
    if _WARNED_FALLBACK:
        return
    _WARNED_FALLBACK = True
    missing = isolation.not_isolated()
    reason = "; ".join(isolation.notes)
    message = (
        "PythonSandbox: bubblewrap is unavailable"
        + (f" ({reason})" if reason else "")
        + ", using the resource-limited subprocess fallback. Not isolated: "
        + ("; ".join(missing) if missing else "nothing beyond the resource limits")
        + ". Install bubblewrap (apt-get install bubblewrap) or use E2BSandbox for untrusted code."
    )
    warnings.warn(message, RuntimeWarning, stacklevel=3)  # once: not also logged
