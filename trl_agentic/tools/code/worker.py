"""One sandboxed interpreter process (:class:`Worker`): how it is started, and one request/reply exchange with it.

The worker runs ``inside/boot.py`` (``python -I -c <boot> <config-json> <modules>``), which hardens the process
(``inside/harden.py``) and serves requests (``inside/repl.py``), inside bubblewrap or as a resource-limited
subprocess. The parent writes requests on a private pipe, reads the replies on another, and reads the program's
stdout and stderr on two more (:mod:`.exchange`).
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from .base import SandboxError
from .bwrap import bwrap_command
from .exchange import Exchange, Outcome, RpcHandler
from .host import count_tasks_of_uid, fresh_uid
from .launch import LaunchSpec
from .proctree import ProcessTree
from .protocol import ByteHeadTail, close_fd, frame, read_chunk

logger = logging.getLogger(__name__)

_LIVE_WORKERS: "weakref.WeakSet[Worker]" = weakref.WeakSet()


_INSIDE = Path(__file__).parent / "inside"


@functools.lru_cache(maxsize=1)
def worker_source() -> tuple[str, ...]:
    """The arguments after ``python -I -c`` that start a worker, less its configuration: the boot script, then
    the name and source of each module it loads (see ``inside/boot.py``)."""
    read = lambda name: (_INSIDE / f"{name}.py").read_text(encoding="utf-8")  # noqa: E731
    return (read("boot"), "harden", read("harden"), "repl", read("repl"), "calls", read("calls"))


def _worker_config(spec: LaunchSpec, req_r: int, resp_w: int) -> dict[str, Any]:
    limits = dict(spec.limits)
    uid = fresh_uid() if spec.uid.fresh_uid else spec.uid.drop_to_uid
    if spec.nproc_extra is not None:
        # A fresh uid has no other task; otherwise the uid's existing tasks count against RLIMIT_NPROC.
        existing = 0 if spec.uid.fresh_uid or spec.count_uid is None else count_tasks_of_uid(spec.count_uid)
        limits["nproc"] = existing + spec.nproc_extra
    return {
        "in_fd": req_r,
        "out_fd": resp_w,
        "limits": limits,
        "drop_to_uid": uid,
        "drop_to_gid": uid,
        "pid_namespace": spec.pid_namespace,
        "output_head_bytes": spec.output_bytes,
        "output_tail_bytes": spec.output_bytes,
        "preimport": list(spec.preimport),
    }


_WARNED_SECCOMP = False


def _warn_without_seccomp(installed: bool) -> None:
    global _WARNED_SECCOMP
    if not installed and not _WARNED_SECCOMP:
        _WARNED_SECCOMP = True
        logger.warning(
            "sandbox worker: the seccomp filter could not be installed on this machine; memfd_create and SysV "
            "shared memory are not refused, so a program can hold memory beyond memory_mb"
        )


class Worker:
    """One sandboxed interpreter process and its pipes."""

    def __init__(self, spec: LaunchSpec):
        self.spec = spec
        self.workdir: str | None = None
        self.proc: subprocess.Popen | None = None
        self.dead = False
        self.uid: int | None = None
        fds: list[int] = []
        try:
            req_r, req_w = os.pipe()
            resp_r, resp_w = os.pipe()
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            fds = [req_r, req_w, resp_r, resp_w, out_r, out_w, err_r, err_w]
            cfg = _worker_config(spec, req_r, resp_w)
            boot, *modules = worker_source()
            interpreter = [spec.python, "-I", "-c", boot, json.dumps(cfg), *modules]
            self.proc = self._start(interpreter, cfg["drop_to_uid"], (req_r, resp_w), out_w, err_w)
        except BaseException:
            for fd in fds:
                close_fd(fd)
            self._cleanup_workdir()
            raise
        for fd in (req_r, resp_w, out_w, err_w):
            close_fd(fd)
        self.req_w, self.resp_r, self.out_r, self.err_r = req_w, resp_r, out_r, err_r
        for fd in (req_w, resp_r, out_r, err_r):
            os.set_blocking(fd, False)
        self._busy = False
        self._fd_lock = threading.Lock()
        self.tree = ProcessTree(self.proc.pid, launcher=spec.backend == "bwrap" or bool(spec.unshare_prefix))
        _LIVE_WORKERS.add(self)

    def _start(
        self, interpreter: list[str], uid: int | None, pass_fds: tuple[int, int], out_w: int, err_w: int
    ) -> subprocess.Popen:
        spec = self.spec
        if spec.backend == "bwrap":
            cmd, env = bwrap_command(spec, interpreter)
            cwd = "/"
        else:
            self.workdir = tempfile.mkdtemp(prefix="trl_agentic_sandbox_")
            os.chmod(self.workdir, 0o700)
            if uid is not None:
                os.chown(self.workdir, uid, uid)
            cmd = list(spec.unshare_prefix) + interpreter
            cwd = self.workdir
            env = dict(spec.env)
            env.update({"HOME": self.workdir, "TMPDIR": self.workdir, "PWD": self.workdir})
        return subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w, pass_fds=pass_fds, cwd=cwd, env=env,
            start_new_session=True, close_fds=True,
        )

    # -- protocol ------------------------------------------------------------------------------------------------

    def alive(self) -> bool:
        return not self.dead and self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float) -> None:
        """Block until the worker says it is ready; raise :class:`SandboxError` with its stderr otherwise."""
        outcome = self.exchange(None, timeout, read_limit=1 << 16)
        if outcome.message is not None and outcome.message.get("ready"):
            self.uid = outcome.message.get("uid")
            _warn_without_seccomp(bool(outcome.message.get("seccomp")))
            self.tree.cpu_seconds()  # find the worker's processes, for the per-block baselines
            return
        stderr = outcome.stderr.text()[0].strip()
        self.kill()
        reason = "timed out" if outcome.timed_out else "exited"
        raise SandboxError(
            f"the sandbox interpreter {reason} during start-up"
            + (f" (status {outcome.returncode})" if outcome.returncode is not None else "")
            + (f": {stderr[-2000:]}" if stderr else "")
        )

    def exchange(
        self,
        request: dict[str, Any] | None,
        timeout: float,
        read_limit: int,
        cpu_limit: float | None = None,
        on_rpc: RpcHandler | None = None,
    ) -> Outcome:
        """Send ``request`` and wait for the reply (see :class:`~.exchange.Exchange`). The worker is killed when no
        valid reply comes within ``timeout`` seconds, when its process tree uses more than ``cpu_limit`` CPU seconds
        meanwhile, or when the program writes more than ``read_limit`` bytes of output."""
        outcome = Outcome(ByteHeadTail(self.spec.output_bytes), ByteHeadTail(self.spec.output_bytes))
        if request is not None:
            self._discard_stale_output()
        start = time.monotonic()
        with self._fd_lock:
            if self.dead:
                outcome.closed = True
                return outcome
            self._busy = True
        try:
            fds = (self.req_w, self.resp_r, self.out_r, self.err_r)
            nonce = secrets.token_hex(16) if request is not None else None  # the ready message has none
            exchange = Exchange(fds, outcome, start + timeout, read_limit, lambda: self.dead, on_rpc, nonce)
            exchange.run(frame({**request, "nonce": nonce}) if request is not None else None, self.tree, cpu_limit)
        finally:
            with self._fd_lock:
                self._busy = False
                if self.dead:
                    self._close_fds()
        if outcome.message is not None and not outcome.output_limit:
            self._drain(outcome, read_limit)
        outcome.duration_s = time.monotonic() - start
        if outcome.message is None:
            # Timeout, death, protocol or output violation: the worker is done for.
            if outcome.eof:
                outcome.returncode = self._wait_exit(1.0)
            self.kill()
            if outcome.returncode is None and self.proc is not None:
                outcome.returncode = self.proc.returncode
        return outcome

    def _drain(self, outcome: Outcome, read_limit: int) -> None:
        out, err = outcome.stdout, outcome.stderr
        for fd, sink in ((self.out_r, out), (self.err_r, err)):
            while out.total + err.total <= read_limit:
                chunk = read_chunk(fd)
                if not chunk:
                    break
                sink.feed(chunk)

    def _discard_stale_output(self) -> None:
        for fd in (self.out_r, self.err_r):
            for _ in range(1024):
                chunk = read_chunk(fd)
                if not chunk:
                    break

    def _wait_exit(self, timeout: float) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """Kill the worker and everything it started; close the pipes (now, or when a running exchange ends)."""
        if self.dead:
            return
        self.dead = True
        proc = self.proc
        if proc is not None:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    proc.kill()
                except (ProcessLookupError, OSError):
                    pass
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL'd processes exit
                logger.warning("sandbox worker %s did not exit after SIGKILL", proc.pid)
        with self._fd_lock:
            if not self._busy:  # else the running exchange closes them when it notices (no fd-number reuse race)
                self._close_fds()
        self._cleanup_workdir()
        _LIVE_WORKERS.discard(self)

    def _close_fds(self) -> None:
        for name in ("req_w", "resp_r", "out_r", "err_r"):
            fd = getattr(self, name, None)
            if fd is not None:
                close_fd(fd)
                setattr(self, name, None)

    def _cleanup_workdir(self) -> None:
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.kill()
        except Exception:  # noqa: BLE001
            pass


@atexit.register
def _kill_all_workers() -> None:
    for worker in list(_LIVE_WORKERS):
        try:
            worker.kill()
        except Exception:  # noqa: BLE001
            pass
