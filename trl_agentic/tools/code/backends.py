"""Which local backend works here: bubblewrap (probed by starting a real sandbox), else the subprocess fallback,
with the ``unshare`` namespaces it can get."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

from .base import SandboxError
from .launch import WorkerOptions, plan_launch
from .worker import Worker

_DETECT_LOCK = threading.Lock()
_DETECTED: dict[tuple, tuple[str, str]] = {}
_PROBE_TIMEOUT = 20.0


def probe_unshare() -> tuple[str, ...]:
    """The ``unshare`` prefix that works here for the fallback (network, IPC and PID namespaces, or network and
    IPC, or network only)."""
    exe = shutil.which("unshare")
    if not exe:
        return ()
    user = () if os.geteuid() == 0 else ("--map-root-user",)
    candidates = [
        (exe, *user, "--net", "--ipc", "--pid", "--fork", "--kill-child", "--mount-proc", "--"),
        (exe, *user, "--net", "--ipc", "--"),
        (exe, *user, "--net", "--"),
    ]
    for prefix in candidates:
        try:
            out = subprocess.run([*prefix, "true"], capture_output=True, timeout=20, env={"PATH": "/usr/bin:/bin"})
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0:
            return prefix
    return ()


def _probe_bwrap(python: str) -> tuple[str, str]:
    """Start one bubblewrap worker and run ``print(1)`` in it."""
    spec, _ = plan_launch("bwrap", python, WorkerOptions(startup_timeout=_PROBE_TIMEOUT))
    try:
        worker = Worker(spec)
        try:
            worker.wait_ready(_PROBE_TIMEOUT)
            outcome = worker.exchange({"code": "print(1)"}, _PROBE_TIMEOUT, 1 << 16)
        finally:
            worker.kill()
    except Exception as exc:  # noqa: BLE001
        return "subprocess", f"bubblewrap does not work here: {exc}"
    stdout, stderr = outcome.stdout.text()[0], outcome.stderr.text()[0]
    error = (outcome.message or {}).get("error")
    if outcome.message is not None and error is None and stdout.strip() == "1":
        return "bwrap", ""
    detail = "\n".join(part for part in (stdout, stderr, error or "") if part).strip() or "no reply"
    return "subprocess", f"bubblewrap probe failed: {detail}"


def detect_sandbox_backend(python: str | None = None) -> tuple[str, str]:
    """``("bwrap", "")`` when a bubblewrap sandbox starts here, else ``("subprocess", reason)``. Probed once per
    interpreter path and process (a real worker is started and runs ``print(1)``)."""
    python = python or sys.executable
    key = (python, os.geteuid(), shutil.which("bwrap"))
    with _DETECT_LOCK:
        if key not in _DETECTED:
            if not shutil.which("bwrap"):
                _DETECTED[key] = ("subprocess", "bubblewrap (bwrap) is not installed")
            else:
                _DETECTED[key] = _probe_bwrap(python)
        return _DETECTED[key]


def choose_backend(requested: str, python: str) -> tuple[str, str]:
    """The backend to use for ``requested`` (``"auto"``, ``"bwrap"`` or ``"subprocess"``) and, for the fallback,
    why bubblewrap was not used. Raises :class:`SandboxError` when ``"bwrap"`` is requested and does not work."""
    if requested not in ("auto", "bwrap", "subprocess"):
        raise ValueError(f"backend must be 'auto', 'bwrap' or 'subprocess', not {requested!r}")
    if requested == "subprocess":
        return "subprocess", ""
    found, reason = detect_sandbox_backend(python)
    if requested == "bwrap" and found != "bwrap":
        raise SandboxError(f"backend='bwrap' was requested but {reason}")
    return found, reason
