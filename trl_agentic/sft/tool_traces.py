"""OpenAI-style tool-calling traces -> the actions and tool results of a native-tool demonstration.

A trace is what agent logs usually hold: assistant messages with ``tool_calls``, each followed by its ``tool``
messages, ending with an assistant message that calls no tool. Replayed through the rollout engine like any
demonstration (:func:`~trl_agentic.sft.demonstrations.transcript_to_trajectory`): each assistant message, as the chat
template writes it up to its end of turn, is the sampled turn (parsed back by the template's response template, as in
RL), and its tool messages are rendered after it by :class:`~trl_agentic.rollout.observations.ObservationEncoder`, as
in RL.

The prompt must show what RL's prompt shows. With the environment RL runs (``environment_factory=`` / ``tools=`` /
a :class:`~trl_agentic.environments.native_tools.ToolCallEnvironment` as ``environment=``) the trace is replayed
against it: ``reset(**row)`` appends its text to the prompt and gives the tools whose schemas it shows, each call
runs for real, and the trace's tool messages must say what the environment returned (:func:`check_tool_results`).
Without one, the row's ``tools`` column gives the schemas and the trace's tool messages are the results.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..environments.base import StepResult
from ..environments.native_tools import ToolCallEnvironment, native_tools
from ..rollout.engine import with_reset_text
from ..rollout.env_calls import EnvFailure, call_all
from ..rollout.observations import ObservationEncoder
from ..trajectory import Trajectory
from .errors import DemonstrationError


class ScriptedToolEnvironment(ToolCallEnvironment):
    """Native tool calls: the prompt shows ``tools``, and each assistant turn that calls tools is answered with the
    demonstration's tool messages; a turn without a call ends the episode."""

    def __init__(self, tools: Sequence[Any], results: Sequence[list[dict[str, Any]]]) -> None:
        super().__init__()
        self.tools = list(tools)
        self.results = list(results)
        self.turn = 0

    def reset(self, **row: Any) -> None:
        self.turn = 0

    async def step(self, message: dict[str, Any]) -> StepResult:
        k, self.turn = self.turn, self.turn + 1
        if k < len(self.results):
            return StepResult(observation=self.results[k], info={"tool_calls": len(message.get("tool_calls") or [])})
        return StepResult(terminated=True)


def is_tool_trace(messages: Sequence[Any]) -> bool:
    """Whether a message list calls tools (an assistant message with ``tool_calls``)."""
    return any(isinstance(m, dict) and m.get("role") == "assistant" and m.get("tool_calls") for m in messages)


def split_tool_messages(encoder: ObservationEncoder, prompt: Sequence[dict[str, Any]],
                        messages: Sequence[dict[str, Any]], tools: Sequence[Any]) -> tuple[list[str], list[list[dict]]]:
    """The text the model samples in each turn (the assistant message as the chat template writes it, up to its end
    of turn) and the tool messages after each turn."""
    actions: list[str] = []
    results: list[list[dict[str, Any]]] = []
    end = encoder.tokenizer.convert_ids_to_tokens(encoder.layout.end_of_turn_id)
    history = [dict(m) for m in prompt]
    for k, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            if not results or not actions:
                raise DemonstrationError(f"message {k}: a tool message must follow an assistant message that calls tools")
            results[-1].append(dict(message))
        elif role == "assistant":
            if results and not results[-1]:
                raise DemonstrationError(f"message {k}: the assistant message before it called tools but got no tool "
                                         "message back")
            before = encoder.render_text(history, add_generation_prompt=True, tools=tools)
            after = encoder.render_text(history + [dict(message)], add_generation_prompt=False, tools=tools)
            if not after.startswith(before) or end not in after[len(before):]:
                raise DemonstrationError(f"message {k}: the chat template does not render this assistant message as "
                                         "a continuation of the conversation")
            delta = after[len(before):]
            actions.append(delta[: delta.rindex(end)])
            results.append([])
        else:
            raise DemonstrationError(f"message {k} has role {role!r}; a tool-calling trace has assistant and tool "
                                     "messages after the prompt")
        history.append(dict(message))
    if not actions or messages[-1].get("role") != "assistant" or messages[-1].get("tool_calls"):
        raise DemonstrationError("a tool-calling trace must end with an assistant message that calls no tool")
    return actions, results[:-1]


def rl_prompt(environment: Any, row: dict[str, Any], prompt: Any, timeout: float) -> tuple[Any, list[Any]]:
    """The prompt RL renders for ``row`` (the text ``reset()`` returns appended) and the tools it shows, read from
    one instance of ``environment``: made, reset with the row, closed (as the engine does at the start of a
    rollout)."""
    try:
        env = environment()
    except Exception as exc:  # noqa: BLE001 - the user's factory: its failure is this demonstration's
        raise DemonstrationError(f"the environment could not be made: {type(exc).__name__}: {exc}") from None
    text = call_all([env], "reset", [dict(row)], timeout)[0]
    tools = native_tools(env) if not isinstance(text, EnvFailure) else None
    call_all([env], "close", [None], timeout)
    if isinstance(text, EnvFailure):
        raise DemonstrationError(f"the environment's reset failed: {text.detail}")
    if tools is None:
        raise DemonstrationError("a tool-calling trace replays against an environment of native tool calls "
                                 "(environment_factory=, tools= or a ToolCallEnvironment); this one takes text actions")
    return with_reset_text(prompt, text), tools


def check_tool_results(trajectory: Trajectory, results: Sequence[list[dict[str, Any]]]) -> None:
    """The tool messages of a trace replayed against the real environment say what it returned: a trace whose
    results differ would teach the model observations RL never shows it."""
    returned = [m for m in trajectory.messages if m.get("role") == "tool"]
    written = [m for messages in results for m in messages]
    if len(returned) != len(written):
        raise DemonstrationError(f"the trace has {len(written)} tool messages, but its calls returned "
                                 f"{len(returned)} in the environment")
    for k, (mine, theirs) in enumerate(zip(written, returned)):
        if str(mine.get("content")) != str(theirs.get("content")):
            raise DemonstrationError(f"tool message {k} of the trace says {str(mine.get('content'))[:80]!r}, but the "
                                     f"environment returned {str(theirs.get('content'))[:80]!r}: fix the trace (RL "
                                     "shows the environment's results)")
