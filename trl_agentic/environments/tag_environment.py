"""A ready-made environment for tag protocols (Search-R1, ReTool): tags map to Python callables.

The model writes ``<search>query</search>`` or ``<code>...</code>``; the environment calls the tool mapped to that
tag and returns its output wrapped in the observation tag of the :class:`~trl_agentic.environments.tag_protocol.TagProtocol`
(``<information>`` as in Search-R1, ``<interpreter>`` as in ReTool). ``<answer>...</answer>`` ends the episode
(``terminated``). Generation stops after each closing tool tag and after the closing answer tag
(``protocol.stop_strings``). An action with neither a tool call nor an answer gets a corrective message.

Tools are :class:`~trl_agentic.tools.Tool` objects or plain callables ``str -> str`` (sync or async). A tool with a
``session()`` method (a stateful code interpreter, say) gets one session per trajectory, closed when the trajectory
ends. The engine caps the tool
output's tokens inside the observation tags (``max_observation_tokens``), so the closing tag always survives.
"""

from __future__ import annotations

import inspect
import re
import warnings
from typing import Any, Callable, Mapping

from ..tools.base import ToolOutput, call_tool, tool_error
from .base import Environment, StepResult
from .tag_protocol import TagProtocol

_WARNED: set[tuple[str, str, str]] = set()  # (tag, tool, kind of failure): each warned once per process


def _warn_once(tag: str, fn: Any, kind: str, detail: str, fix: str) -> None:
    """One ``RuntimeWarning`` per tool and kind of failure (``kind``: what it returned, or the exception type): such
    a call costs only an error observation that the model reads, which is easy to miss in a long run."""
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    if (tag, name, kind) not in _WARNED:
        _WARNED.add((tag, name, kind))
        warnings.warn(f"the {tag} tool ({name}) {detail}: the model reads an error observation instead of its output "
                      f"(warned once per tool); {fix}", RuntimeWarning, stacklevel=3)


DEFAULT_INVALID_MESSAGE = (
    "\nMy previous action is invalid. If I want to use a tool, I should put the query between {tool_tags}. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n"
)


def _protocol_from_tools(tools: Mapping[str, Any], protocol: TagProtocol | None) -> TagProtocol:
    declared = {tag: value[1] for tag, value in tools.items() if isinstance(value, tuple)}
    if protocol is None:
        return TagProtocol(tools={tag: declared.get(tag, "information") for tag in tools})
    missing = [tag for tag in tools if tag not in protocol.tools]
    conflicting = [tag for tag, obs in declared.items() if protocol.tools.get(tag) != obs]
    if missing or conflicting:
        raise ValueError(f"tools {missing or conflicting} do not match the protocol's tool tags {dict(protocol.tools)}")
    return protocol


class TagEnvironment(Environment):
    """Tag-protocol environment; one instance per trajectory (use ``functools.partial`` to configure it).

    Args:
        tools: ``{tag: callable}`` or ``{tag: (callable, observation_tag)}``, e.g. ``{"search": (search,
            "information"), "code": (sandbox, "interpreter")}``.
        protocol: The tag protocol; by default built from ``tools`` (observation tag ``information`` unless given,
            ``<think>`` and ``<answer>``). Pass the same object to the format and tool-use rewards.
        observation_template: Format of an observation; ``{tag}`` and ``{content}`` are filled in. The default
            reproduces Search-R1's ``\\n\\n<information>...</information>\\n\\n``.
        invalid_message: Text returned for an action with no tool call and no answer; ``{tool_tags}`` is filled in.
        tool_timeout: Seconds a tool call may take before an error observation is returned (``None``: no limit
            here; the engine's ``env_timeout`` still applies to the whole step).
    """

    def __init__(
        self,
        tools: Mapping[str, Any],
        protocol: TagProtocol | None = None,
        observation_template: str = "\n\n<{tag}>{content}</{tag}>\n\n",
        invalid_message: str = DEFAULT_INVALID_MESSAGE,
        tool_timeout: float | None = 30.0,
    ) -> None:
        if not tools:
            raise ValueError("TagEnvironment needs at least one tool")
        self.protocol = _protocol_from_tools(tools, protocol)
        # the tool serving each tag (its output is wrapped in the protocol's observation tag of that tag)
        self.tools: dict[str, Any] = {tag: value[0] if isinstance(value, tuple) else value
                                      for tag, value in tools.items()}
        self.observation_template = observation_template
        self.invalid_message = invalid_message
        self.tool_timeout = tool_timeout
        self._pattern = self.protocol.action_pattern()
        self.stop_strings: list[str] = self.protocol.stop_strings  # each tool's closing tag and the answer's
        self._sessions: dict[str, Any] = {}
        self.answer: str | None = None

    def reset(self, **row: Any) -> str | None:
        self.answer = None
        self._sessions = {}
        return None

    async def step(self, action: str) -> StepResult:
        match = self._pattern.search(action)
        if match is None:
            tags = " or ".join(f"<{t}> and </{t}>" for t in self.tools)
            info = {"tool": [], "invalid": 1, "unknown_tool": int(self._mentions_unknown_tag(action))}
            return StepResult(observation=self.invalid_message.format(tool_tags=tags), info=info)
        tag, content = match.group(1), match.group(2).strip()
        if tag == self.protocol.answer:
            self.answer = content
            return StepResult(terminated=True, info={"answer": content})
        output, info = await self._call_tool(tag, content)
        observation = self.observation_template.format(tag=self.protocol.tools[tag], content=output)
        return StepResult(observation=observation, info=info)

    async def close(self) -> None:
        sessions, self._sessions = self._sessions, {}
        for session in sessions.values():
            result = session.close()
            if inspect.isawaitable(result):
                await result

    # -- helpers ---------------------------------------------------------------------------------------------
    def _mentions_unknown_tag(self, action: str) -> bool:
        return bool(re.search(r"<([a-zA-Z_]\w*)>.*?</\1>", action, re.DOTALL))

    def _callable_for(self, tag: str) -> Callable[..., Any]:
        fn = self.tools[tag]
        if hasattr(fn, "session") and callable(fn.session):
            if tag not in self._sessions:
                self._sessions[tag] = fn.session()
            fn = self._sessions[tag]
        return fn

    async def _call_tool(self, tag: str, content: str) -> tuple[str, dict[str, Any]]:
        """Run one tool call under ``tool_timeout`` (:func:`~trl_agentic.tools.base.call_tool`). Tools from
        :mod:`trl_agentic.tools` report their status (``ToolOutput``: error, timeout, truncation); plain callables
        report by raising. A failed call, or output that is not text, is an error observation in the one format
        (:func:`~trl_agentic.tools.base.tool_error`); the episode goes on."""
        info: dict[str, Any] = {"tool": [tag]}
        fn = self._callable_for(tag)
        call = await call_tool(fn, (content,), timeout=self.tool_timeout)
        if call.timed_out:
            info["tool_timeout"] = info["tool_error"] = 1
            return tool_error(f"the {tag} tool {call.error}"), info
        if call.error is not None:
            info["tool_error"] = 1
            _warn_once(tag, fn, call.exception, f"raised {call.exception}: {call.error[:200]}",
                       "make it return the error as text if that is what the model should read")
            return tool_error(f"{call.exception}: {call.error}"), info
        output = call.value
        if isinstance(output, ToolOutput):
            info.update(output.as_info())
            return output.observation, info
        if isinstance(output, bytes):
            output = output.decode("utf-8", errors="replace")
        if not isinstance(output, str):
            info["tool_error"] = 1
            _warn_once(tag, fn, type(output).__name__, f"returned {type(output).__name__}, not text",
                       "make it return a str")
            return tool_error(f"the {tag} tool returned {type(output).__name__}, not text"), info
        return output.encode("utf-8", errors="replace").decode("utf-8"), info
