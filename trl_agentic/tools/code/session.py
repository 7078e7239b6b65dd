"""One trajectory's local interpreter (:class:`PythonSession`): a worker taken from the pool on the first call,
restarted when it dies, and every way a block can end turned into an :class:`ExecutionResult`."""

from __future__ import annotations

import signal
from typing import Any, Callable

from .base import CodeSession
from .exchange import Outcome, RpcHandler
from .result import STATE_LOST, ExecutionResult
from .worker import Worker


class PythonSession(CodeSession):
    """One trajectory's interpreter: state persists across calls until :meth:`close` (or a restart).

    Created by :meth:`PythonSandbox.session`. Calls are serialized. ``session(text)`` returns the observation
    text and stores :attr:`last_result`; :meth:`run` returns the :class:`ExecutionResult`. The worker is taken
    from the pool on the first call, not at creation, so opening a session never blocks.

    Attributes:
        last_result: The :class:`ExecutionResult` of the latest call.
        num_calls, num_errors, num_timeouts, num_restarts: Counters for this session.
    """

    def __init__(self, sandbox: Any, acquire: Callable[[], Worker]):
        """``sandbox``: the settings (``timeout``, ``max_read_bytes``, ``cpu_time``, output limits) of its
        :class:`PythonSandbox`; ``acquire``: takes a worker from the sandbox's pool (raises once it is closed)."""
        super().__init__(sandbox)
        self._acquire = acquire
        self._worker: Worker | None = None
        self._had_worker = False

    def _release(self) -> None:
        """Kill the worker and every process it started."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.kill()

    def _ensure_worker(self) -> tuple[Worker | None, str, ExecutionResult | None]:
        """The live worker (acquired or replaced if needed), a notice when a dead one was replaced, or an error."""
        notice = ""
        if self._worker is not None and not self._worker.alive():
            self._release()
            notice = (
                "[the previous interpreter process had exited; this block ran in a fresh one, so earlier "
                "variables are gone]\n"
            )
        if self._worker is None:
            try:
                self._worker = self._acquire()
            except Exception as exc:  # noqa: BLE001
                error = f"SandboxError: could not start the Python interpreter: {exc}"
                return None, notice, ExecutionResult(error=error)
            if self._had_worker:
                self.num_restarts += 1
            self._had_worker = True
        return self._worker, notice, None

    def _run_locked(self, code: str) -> ExecutionResult:
        return self._request_guarded({"code": code})[0]

    def request(
        self, message: dict[str, Any], *, timeout: float | None = None, on_rpc: RpcHandler | None = None
    ) -> tuple[ExecutionResult, dict[str, Any] | None]:
        """Send one protocol request (``{"code": ...}``, ``{"call": ...}``, ``{"code": ..., "test": true}``, see
        ``inside/repl.py``) and return its result and the worker's raw reply (None when there was none). For the
        unit-test harness (:mod:`.unit_tests`); never raises. ``timeout`` defaults to the sandbox's."""
        with self._lock:
            return self._request_guarded(message, timeout, on_rpc)

    def _request_guarded(
        self, message: dict[str, Any], timeout: float | None = None, on_rpc: RpcHandler | None = None
    ) -> tuple[ExecutionResult, dict[str, Any] | None]:
        try:
            return self._request_locked(message, timeout, on_rpc)
        except Exception as exc:  # noqa: BLE001 - e.g. close() from another thread mid-run; never raise
            self._release()
            error = f"SandboxError: {type(exc).__name__}: {exc}; {STATE_LOST}"
            return ExecutionResult(error=error, state_lost=True), None

    def _request_locked(
        self, message: dict[str, Any], timeout: float | None, on_rpc: RpcHandler | None
    ) -> tuple[ExecutionResult, dict[str, Any] | None]:
        sandbox = self._owner
        if self.closed:
            return ExecutionResult(error="RuntimeError: this Python session is closed."), None
        code = message.get("code")
        if isinstance(code, str) and len(code) > sandbox.max_code_chars:
            error = f"ValueError: the code is longer than {sandbox.max_code_chars} characters."
            return ExecutionResult(error=error), None
        worker, notice, failure = self._ensure_worker()
        if failure is not None:
            return failure, None
        timeout = sandbox.timeout if timeout is None else timeout
        outcome = worker.exchange(message, timeout, sandbox.max_read_bytes, sandbox.cpu_time, on_rpc)
        result = _to_result(outcome, notice, sandbox, self.closed, timeout)
        if outcome.message is None:
            self._worker = None
        elif outcome.message.get("restart"):  # the worker cannot go on (it exits after this reply)
            self._release()
            result.state_lost = True
        return result, outcome.message

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


def _to_result(outcome: Outcome, notice: str, sandbox: Any, closed: bool, timeout: float) -> ExecutionResult:
    """The :class:`ExecutionResult` of one exchange (``notice`` goes before stderr)."""
    stdout, dropped_out = outcome.stdout.text()
    stderr, dropped_err = outcome.stderr.text()
    result = ExecutionResult(
        stdout=stdout, stderr=notice + stderr, state_lost=bool(notice), duration_s=outcome.duration_s
    )
    dropped = dropped_out + dropped_err
    message = outcome.message
    if message is not None:
        worker_dropped = message.get("dropped") or {}
        dropped += sum(int(v) for v in worker_dropped.values() if isinstance(v, (int, float)))
        error = message.get("error")
        result.error = str(error) if error is not None else None
        if outcome.forged:
            result.error = (f"SandboxError: the program wrote {outcome.forged} message(s) on the interpreter's "
                            "private reply channel; they were ignored" + (f"\n{result.error}" if result.error else ""))
    else:
        result.state_lost = True
        result.exit_status = _exit_status(outcome.returncode)
        if outcome.timed_out:
            result.timed_out = True
            result.error = f"TimeoutError: execution exceeded {timeout:g} s; {STATE_LOST}"
        elif outcome.cpu_limit:
            result.error = (
                f"CPUTimeLimitError: the program used more than {sandbox.cpu_time:g} s of CPU time; {STATE_LOST}"
            )
        elif outcome.output_limit:
            result.error = (
                f"OutputLimitError: the program wrote more than {sandbox.max_read_bytes} bytes of output; "
                f"{STATE_LOST}"
            )
            dropped += 1
        elif outcome.closed or closed:
            result.error = "SandboxError: the session was closed while the code was running."
        elif outcome.protocol_error:
            result.error = f"SandboxError: the interpreter sent an invalid reply; {STATE_LOST}"
        else:
            result.error = _death_message(result.exit_status, sandbox)
    result.dropped_bytes = dropped
    result.output_truncated = dropped > 0
    return result


def _exit_status(returncode: int | None) -> int | None:
    if returncode is None:
        return None
    # bwrap and unshare report a child killed by signal N as 128 + N.
    if returncode > 128 and returncode - 128 < 65:
        return -(returncode - 128)
    return returncode


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _death_message(status: int | None, sandbox: Any) -> str:
    if status is None:
        what = "the interpreter process ended unexpectedly"
    elif status < 0:
        sig = -status
        what = f"the interpreter process was killed by {_signal_name(sig)}"
        if sig == getattr(signal, "SIGXCPU", -1):
            return (
                f"CPUTimeLimitError: the interpreter used the session's {sandbox.session_cpu_time:g} s of CPU time "
                f"({what}); {STATE_LOST}"
            )
        if sig == signal.SIGKILL:
            what += " (a resource limit, e.g. memory, or an explicit kill)"
    else:
        what = f"the interpreter process exited with status {status}"
    return f"ProcessExit: {what}; {STATE_LOST}"
