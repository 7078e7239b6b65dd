"""Remote code execution in E2B cloud sandboxes (Firecracker micro-VMs), with the :class:`PythonSandbox` interface.

Needs ``pip install trl-agentic[e2b]`` (the ``e2b-code-interpreter`` package) and an API key in ``E2B_API_KEY``
(or ``api_key=``). Each session is one remote sandbox whose Jupyter kernel keeps variables between blocks; it is
created on the first call and killed by ``close()``. A stateless call is a one-shot session.

Failures never raise into the rollout: a service that cannot be reached, an authentication error or a timeout
becomes an error observation (``SandboxError: ...`` / ``TimeoutError: ...``) and an :class:`ExecutionResult`
with ``error`` set. Only the constructor raises, for a missing package or a missing API key, so that a
misconfigured run stops before training starts; :meth:`E2BSandbox.check` additionally opens and closes one
sandbox to verify the key and connectivity up front.

Isolation is E2B's (a separate VM per sandbox). E2B sandboxes have internet access unless created with
``allow_internet_access=False`` (the default here).
"""

from __future__ import annotations

import os
import re
import time
from typing import Any, Callable

from .base import CodeSandbox, CodeSession, SandboxError
from .result import ExecutionResult

__all__ = ["E2BSandbox", "E2BSession"]

_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_STATE_LOST = "the sandbox was restarted and its state (variables, imports) was lost."
_INSTALL_HINT = "E2BSandbox needs the e2b-code-interpreter package: pip install trl-agentic[e2b]"


def _import_sandbox_cls() -> Any:
    try:
        from e2b_code_interpreter import Sandbox
    except ImportError as exc:  # pragma: no cover - exercised when the extra is missing
        raise ImportError(_INSTALL_HINT) from exc
    return Sandbox


def _is_timeout(exc: BaseException) -> bool:
    name = type(exc).__name__
    return "Timeout" in name or isinstance(exc, TimeoutError)


class E2BSession(CodeSession):
    """One remote sandbox (one Jupyter kernel) for one trajectory. Same interface as ``PythonSession``."""

    def __init__(self, owner: "E2BSandbox"):
        super().__init__(owner)
        self._sandbox: Any = None
        self._had_sandbox = False

    def _create(self) -> Any:
        owner = self._owner
        kwargs: dict[str, Any] = {"api_key": owner.api_key, "timeout": int(owner.sandbox_timeout)}
        if owner.template is not None:
            kwargs["template"] = owner.template
        if owner.allow_internet_access is not None:
            kwargs["allow_internet_access"] = owner.allow_internet_access
        if owner.request_timeout is not None:
            kwargs["request_timeout"] = owner.request_timeout
        kwargs.update(owner.create_kwargs)
        create = getattr(owner.sandbox_cls, "create", None)
        return create(**kwargs) if callable(create) else owner.sandbox_cls(**kwargs)

    def _run_locked(self, code: str) -> ExecutionResult:
        owner = self._owner
        if self.closed:
            return ExecutionResult(error="RuntimeError: this Python session is closed.")
        start = time.monotonic()
        if self._sandbox is None:
            try:
                self._sandbox = self._create()
            except Exception as exc:  # noqa: BLE001 - unreachable service, bad key, quota...
                return ExecutionResult(
                    error=f"SandboxError: could not create an E2B sandbox ({type(exc).__name__}: {exc}). "
                    "Check E2B_API_KEY and that the E2B service is reachable.",
                    duration_s=time.monotonic() - start,
                )
            if self._had_sandbox:
                self.num_restarts += 1
            self._had_sandbox = True
        try:
            execution = self._sandbox.run_code(code, timeout=owner.timeout)
        except Exception as exc:  # noqa: BLE001
            self._release()
            if _is_timeout(exc):
                return ExecutionResult(
                    error=f"TimeoutError: execution exceeded {owner.timeout:g} s; {_STATE_LOST}",
                    timed_out=True,
                    state_lost=True,
                    duration_s=time.monotonic() - start,
                )
            return ExecutionResult(
                error=f"SandboxError: {type(exc).__name__}: {exc}; {_STATE_LOST}",
                state_lost=True,
                duration_s=time.monotonic() - start,
            )
        return self._to_result(execution, time.monotonic() - start)

    @staticmethod
    def _to_result(execution: Any, duration: float) -> ExecutionResult:
        logs = getattr(execution, "logs", None)
        stdout = "".join(getattr(logs, "stdout", None) or [])
        stderr = "".join(getattr(logs, "stderr", None) or [])
        text = getattr(execution, "text", None)
        if text is not None and str(text) != "":
            if stdout and not stdout.endswith("\n"):
                stdout += "\n"
            stdout += f"{text}\n"
        error = getattr(execution, "error", None)
        error_text = None
        if error is not None:
            traceback = _ANSI_RE.sub("", str(getattr(error, "traceback", "") or ""))
            name = getattr(error, "name", "Error")
            value = getattr(error, "value", "")
            last = f"{name}: {value}"
            error_text = traceback.rstrip("\n") if traceback.strip() else last
            if last not in error_text:
                error_text += "\n" + last
        return ExecutionResult(stdout=stdout, stderr=stderr, error=error_text, duration_s=duration)

    def _release(self) -> None:
        """Kill the remote sandbox."""
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            try:
                sandbox.kill()
            except Exception:  # noqa: BLE001 - best effort
                pass



class E2BSandbox(CodeSandbox):
    """Code interpreter backed by E2B; drop-in for :class:`~trl_agentic.tools.PythonSandbox`.

    Args:
        api_key: E2B API key (default: ``$E2B_API_KEY``). Missing -> ``ValueError`` at construction.
        template: E2B template name (default: the SDK's code-interpreter template).
        timeout: Per-block execution timeout, seconds; on expiry the remote sandbox is killed (state lost).
        sandbox_timeout: Lifetime of an idle remote sandbox, seconds (E2B kills it afterwards).
        allow_internet_access: Passed to ``Sandbox.create`` (default False: no internet from the sandbox).
        request_timeout: Connection timeout for API requests, seconds.
        max_output_chars, traceback_lines: As for ``PythonSandbox``.
        sandbox_cls: The class to create sandboxes with (default ``e2b_code_interpreter.Sandbox``; tests pass a
            fake). Must provide ``create(**kwargs)`` (or be callable) returning an object with
            ``run_code(code, timeout=...)`` and ``kill()``.
        create_kwargs: Extra keyword arguments for ``Sandbox.create``.
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        template: str | None = None,
        timeout: float = 10.0,
        sandbox_timeout: float = 300.0,
        allow_internet_access: bool | None = False,
        request_timeout: float | None = 30.0,
        max_output_chars: int = 4000,
        traceback_lines: int = 20,
        sandbox_cls: Callable[..., Any] | None = None,
        create_kwargs: dict[str, Any] | None = None,
    ):
        self.sandbox_cls = sandbox_cls if sandbox_cls is not None else _import_sandbox_cls()
        self.api_key = api_key or os.environ.get("E2B_API_KEY")
        if not self.api_key:
            raise ValueError(
                "E2BSandbox needs an E2B API key: set the E2B_API_KEY environment variable or pass api_key=... "
                "(get one at https://e2b.dev). For local execution use PythonSandbox instead."
            )
        self.template = template
        self.timeout = float(timeout)
        self.sandbox_timeout = float(sandbox_timeout)
        self.allow_internet_access = allow_internet_access
        self.request_timeout = request_timeout
        self.max_output_chars = int(max_output_chars)
        self.traceback_lines = int(traceback_lines)
        self.create_kwargs = dict(create_kwargs or {})

    def session(self) -> E2BSession:
        """A new remote sandbox (created lazily on the first call); ``close()`` it when the trajectory ends."""
        return E2BSession(self)

    def check(self) -> None:
        """Create and kill one remote sandbox; raise :class:`SandboxError` with the reason if that fails (bad key,
        service unreachable). Call it before training to fail fast."""
        result = self.run("print('ok')")  # a one-shot session: created, run, killed
        if not result.ok or result.stdout.strip() != "ok":
            raise SandboxError(f"E2B sandbox check failed: {result.to_observation()}")

    def close(self) -> None:
        """Nothing pooled to release (sessions own their remote sandboxes)."""
