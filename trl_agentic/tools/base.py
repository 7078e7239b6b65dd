"""The one tool abstraction: text in, observation text out.

A :class:`Tool` implements :meth:`Tool.invoke` (``text -> ToolOutput``: the observation with the flags the rollout
engine counts, ``tool_error``, ``tool_timeout``, ``observation_truncated``); calling it (``tool(text) -> str``),
``await tool.acall(text)`` and ``await tool.ainvoke(text)`` follow. A tool never raises for bad input: a malformed
expression, a failing program, a retrieval server that is down all become an error *text* the model can read.
``invoke`` is race-free, unlike ``last_result``/``last_error`` attributes, when one stateless tool is shared by many
trajectories.

A *stateful* tool (the Python interpreter) also has ``session() -> Tool``: the tag environment calls it once per
trajectory and ``close()`` on the session when the trajectory ends; the session's state (variables, imports)
persists between calls.

Wherever a tool is accepted, a plain callable ``str -> str`` (sync or async) works too: :func:`call_tool` and
:func:`acall_tool` call either and always return a :class:`ToolOutput`; exceptions raised by foreign callables
become error outputs.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from ..workers import run_in_thread

__all__ = [
    "Tool",
    "ToolOutput",
    "call_tool",
    "acall_tool",
    "truncate_middle",
]


@dataclass
class ToolOutput:
    """An observation plus what the engine counts about it.

    Attributes:
        observation: The text shown to the model.
        error: The call failed (bad input, exception in the program, server down...).
        timeout: The call ran out of time.
        observation_truncated: The observation was shortened to fit a size limit.
        info: Extra details (e.g. the exit status of a program), kept on the trajectory.
    """

    observation: str
    error: bool = False
    timeout: bool = False
    observation_truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Neither an error nor a timeout."""
        return not (self.error or self.timeout)

    def as_info(self) -> dict[str, Any]:
        """The keys the rollout engine counts (``tool_error``, ``tool_timeout``, ``observation_truncated``),
        merged with :attr:`info`; ready to go into ``StepResult.info``."""
        out = dict(self.info)
        out["tool_error"] = bool(self.error or self.timeout)
        out["tool_timeout"] = bool(self.timeout)
        out["observation_truncated"] = bool(self.observation_truncated)
        return out


class Tool:
    """A tool: implement :meth:`invoke`; ``__call__``, ``acall`` and ``ainvoke`` follow (module docstring).

    ``acall``/``ainvoke`` run :meth:`invoke` on a daemon thread of its own (``run_in_thread``), so a blocking tool does
    not hold up the other trajectories of a turn, and one that hangs past its caller's timeout is abandoned without
    holding a shared thread pool.
    """

    name: str = "tool"

    def invoke(self, text: str) -> ToolOutput:  # pragma: no cover - abstract
        """The observation for ``text`` and its flags; never raises for bad input."""
        raise NotImplementedError

    def __call__(self, text: str) -> str:
        return self.invoke(text).observation

    async def ainvoke(self, text: str) -> ToolOutput:
        return await run_in_thread(self.invoke, text, timeout=None)

    async def acall(self, text: str) -> str:
        return (await self.ainvoke(text)).observation


def _error_output(tool: Any, exc: BaseException) -> ToolOutput:
    name = getattr(tool, "name", None) or type(tool).__name__
    return ToolOutput(observation=f"Error: tool {name} failed: {type(exc).__name__}: {exc}", error=True)


def call_tool(tool: Any, text: str) -> ToolOutput:
    """Call ``tool`` on ``text`` and return a :class:`ToolOutput`, whatever the tool is.

    Uses ``tool.invoke`` when present; otherwise calls ``tool(text)`` and wraps the string. An exception becomes
    an error output (``Error: tool NAME failed: ...``) instead of propagating.
    """
    try:
        invoke = getattr(tool, "invoke", None)
        if callable(invoke):
            out = invoke(text)
            if isinstance(out, ToolOutput):
                return out
            return ToolOutput(observation="" if out is None else str(out))
        out = tool(text)
        return ToolOutput(observation="" if out is None else str(out))
    except Exception as exc:  # noqa: BLE001 - a tool must never take the training loop down
        return _error_output(tool, exc)


async def acall_tool(tool: Any, text: str) -> ToolOutput:
    """Async :func:`call_tool`: uses ``ainvoke``/``acall`` when present, else runs the sync path in a thread."""
    try:
        ainvoke = getattr(tool, "ainvoke", None)
        if callable(ainvoke):
            out = await ainvoke(text)
            if isinstance(out, ToolOutput):
                return out
            return ToolOutput(observation="" if out is None else str(out))
        acall = getattr(tool, "acall", None)
        if callable(acall):
            out = await acall(text)
            return ToolOutput(observation="" if out is None else str(out))
        if inspect.iscoroutinefunction(tool) or inspect.iscoroutinefunction(getattr(tool, "__call__", None)):
            out = await tool(text)
            return ToolOutput(observation="" if out is None else str(out))
        return await run_in_thread(call_tool, tool, text, timeout=None)
    except Exception as exc:  # noqa: BLE001
        return _error_output(tool, exc)


def truncate_middle(text: str, max_chars: int | None, *, omitted_extra: int = 0) -> tuple[str, bool]:
    """Shorten ``text`` to about ``max_chars`` characters, keeping its head and its tail.

    The middle is replaced by a marker ``\\n... [N characters truncated] ...\\n``; both ends matter for program
    output (the first lines and the final error or result). ``omitted_extra`` counts characters already dropped
    upstream (which left their own marker in ``text``): it is added to ``N`` when ``text`` is shortened again, and
    makes the result count as truncated even when ``text`` fits.

    Returns:
        ``(text, truncated)``.
    """
    if max_chars is None or max_chars <= 0:
        return text, omitted_extra > 0
    if len(text) <= max_chars:
        # What is left fits; an upstream truncation (if any) left its own marker in the text.
        return text, omitted_extra > 0
    head = max_chars // 2
    tail = max_chars - head
    omitted = len(text) - head - tail + omitted_extra
    marker = f"\n... [{omitted} characters truncated] ...\n"
    return text[:head] + marker + text[len(text) - tail :], True

