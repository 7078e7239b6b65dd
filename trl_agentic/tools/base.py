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

Wherever a tool is accepted, a plain callable (sync or async) works too. :func:`call_tool` is the one way every
environment calls a tool, under a timeout, and :func:`tool_error` the one format of a failed call as the model reads
it (TRL's ``{'error': '...'}``). What a tool itself reports (a Python traceback, a calculator's "Error: ...") is its
output, not a failed call.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass, field
from typing import Any

from ..workers import run_in_thread, run_on_caller_thread

__all__ = [
    "Tool",
    "ToolCall",
    "ToolOutput",
    "call_tool",
    "tool_error",
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
        """The counts the library reads (``tool_error``, ``tool_timeout``, ``observation_truncated``:
        :class:`~trl_agentic.environments.base.StepInfo`), merged with :attr:`info`; ready to go into ``StepResult.info``."""
        out = dict(self.info)
        out["tool_error"] = int(self.error or self.timeout)
        out["tool_timeout"] = int(self.timeout)
        out["observation_truncated"] = int(self.observation_truncated)
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


def tool_error(message: str) -> str:
    """The one format of a failed tool call, as the model reads it: TRL's ``str({"error": message})`` (a ``repr``:
    an unprintable character, a lone surrogate included, comes out escaped)."""
    return str({"error": message})


@dataclass
class ToolCall:
    """What one call returned: ``value`` (a :class:`Tool`'s :class:`ToolOutput`, or a plain callable's value), or
    why it failed: ``error`` (the exception's message, as TRL writes it; or the timeout, with ``timed_out``) and
    ``exception`` (its type's name)."""

    value: Any = None
    error: str | None = None
    exception: str | None = None
    timed_out: bool = False


async def call_tool(tool: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None, *,
                    timeout: float | None, on_caller_thread: bool = False) -> ToolCall:
    """Call ``tool(*args, **kwargs)`` once, the one way every environment calls a tool (tag environments with the
    action's text, native tool calls with the parsed arguments), under ``timeout`` seconds:

    - a :class:`Tool` (``ainvoke``): its :class:`ToolOutput`, from a daemon thread of its own;
    - an ``async`` callable: awaited (cancelled at its next ``await`` once the timeout passes);
    - a sync callable: on a daemon worker thread (abandoned at the timeout), or, with ``on_caller_thread``, on the
      thread that runs the rollout, one call after another, as TRL 1.16 runs sync tools
      (:func:`~trl_agentic.workers.run_on_caller_thread`).

    Never raises for what the tool does: an exception is its message in ``error`` and its type in ``exception``, a
    timeout ``error`` with ``timed_out``."""
    kwargs = kwargs or {}
    try:
        if callable(getattr(tool, "ainvoke", None)):
            value = await asyncio.wait_for(tool.ainvoke(*args, **kwargs), timeout)
        elif inspect.iscoroutinefunction(tool) or inspect.iscoroutinefunction(getattr(tool, "__call__", None)):
            value = await asyncio.wait_for(tool(*args, **kwargs), timeout)
        elif on_caller_thread:
            value = await run_on_caller_thread(lambda: tool(*args, **kwargs), timeout=timeout)
        else:
            value = await run_in_thread(lambda: tool(*args, **kwargs), timeout=timeout)
    except asyncio.TimeoutError:
        return ToolCall(error=f"timed out after {timeout} s", timed_out=True)
    except Exception as exc:  # noqa: BLE001 - a failing tool is the model's to read, never the run's
        return ToolCall(error=str(exc), exception=type(exc).__name__)
    return ToolCall(value=value)


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

