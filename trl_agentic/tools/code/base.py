"""What every code interpreter shares (the local sandbox and E2B): text in, :class:`ExecutionResult` out.

A *sandbox* (:class:`CodeSandbox`) hands out *sessions* (:class:`CodeSession`), one per trajectory, whose state
persists between calls; a stateless call on the sandbox is a one-shot session. Both are tools
(:class:`~trl_agentic.tools.base.Tool`): ``invoke(text)`` runs the code extracted from the text and returns a
:class:`~trl_agentic.tools.base.ToolOutput`. A new backend implements :meth:`CodeSandbox.session`,
:meth:`CodeSession._run_locked`, :meth:`CodeSession._release` and
:meth:`CodeSandbox.close`.
"""

from __future__ import annotations

import threading
from typing import Any

from ..base import Tool, ToolOutput
from .extract import extract_code
from .result import ExecutionResult


class SandboxError(RuntimeError):
    """The sandbox could not be set up (bad configuration, or a requested backend that does not work here)."""


class CodeTool(Tool):
    """``invoke`` runs the code extracted from the text, and ``with`` closes the object. Subclasses implement
    ``run(code)`` and ``close()``."""

    name = "python"

    def run(self, code: str) -> ExecutionResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def invoke(self, text: str) -> ToolOutput:
        return self.run(extract_code(text)).to_tool_output()

    def close(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class CodeSession(CodeTool):
    """One trajectory's interpreter: calls serialized by a lock and counted, and the owner's output limits set on
    every :class:`ExecutionResult`. Subclasses implement ``_run_locked(code)`` (never raising) and ``_release()``.

    Attributes:
        last_result: The :class:`ExecutionResult` of the latest call.
        num_calls, num_errors, num_timeouts, num_restarts: Counters for this session.
    """

    def __init__(self, owner: Any):
        self._owner = owner
        self._lock = threading.Lock()
        self.closed = False
        self.last_result: ExecutionResult | None = None
        self.num_calls = 0
        self.num_errors = 0
        self.num_timeouts = 0
        self.num_restarts = 0

    def run(self, code: str) -> ExecutionResult:
        """Execute ``code`` in this session and return the structured result (never raises)."""
        with self._lock:
            self.num_calls += 1
            result = self._run_locked(code if isinstance(code, str) else str(code))
            result.max_output_chars = self._owner.max_output_chars
            result.traceback_lines = self._owner.traceback_lines
            if result.error is not None:
                self.num_errors += 1
            if result.timed_out:
                self.num_timeouts += 1
            self.last_result = result
            return result

    def _run_locked(self, code: str) -> ExecutionResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def _release(self) -> None:  # pragma: no cover - abstract
        """Free the interpreter (kill the worker, the remote sandbox...); the next call starts a fresh one."""
        raise NotImplementedError

    def restart(self) -> None:
        """Kill the interpreter; the next call starts a fresh one (state lost)."""
        with self._lock:
            self._release()

    def close(self) -> None:
        """Kill the interpreter and everything it started. Further calls return an error text."""
        self.closed = True
        self._release()


class CodeSandbox(CodeTool):
    """A code interpreter that hands out sessions; a stateless call is a one-shot session. Subclasses implement
    ``session()`` and ``close()``."""

    def session(self) -> CodeSession:  # pragma: no cover - abstract
        raise NotImplementedError

    def run(self, code: str) -> ExecutionResult:
        """Run ``code`` in a one-shot session (fresh state) and return the :class:`ExecutionResult`."""
        session = self.session()
        try:
            return session.run(code)
        finally:
            session.close()
