"""Tool-use shaping in the style of ToolRL (Qian et al. 2025, "ToolRL: Reward is All Tool Learning Needs",
arXiv 2504.13958).

For the tools the task needs, ``N_G``, and the known tools the model called validly, ``N_P``, the reward credits
the tool choice with ToolRL's name-matching term ``|N_G ∩ N_P| / |N_G ∪ N_P|`` (1 when both are empty), and
subtracts a fixed penalty per call to an unknown tool, per invalid call, and per consecutive duplicate call (same
tool, same arguments as the call just before)::

    r = need_reward * |N_G ∩ N_P| / |N_G ∪ N_P| - unknown_penalty * n_unknown
        - invalid_penalty * n_invalid - duplicate_penalty * n_duplicate,      clipped to [low, high]

The clip bounds the shaping whatever the number of turns. The need term is skipped when the task's tools are not
given (no ``required_tools`` and no value in ``required_column``).

Calls are read, by priority:

1. from ``trajectory.turn_infos``: ``tool`` (the name called), ``invalid`` (the action could not be parsed as a
   call), ``unknown_tool`` (it named a tool that does not exist, as
   :class:`~trl_agentic.environments.tag_environment.TagEnvironment` reports); the arguments are the action's tool block. A tool
   that ran but failed (``tool_error``) is not penalized;
2. else, when chat messages carry ``tool_calls`` (TRL's own tool loop), from those; a tool message whose content
   is an ``{"error": ...}`` marks its call invalid;
3. else from the tool tags in the model's (assistant) text; an empty tool block is an invalid call, and unknown tools cannot
   be seen this way.
"""

from __future__ import annotations

import ast
import itertools
import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..environments.base import read_info
from ..environments.tag_protocol import ANY_TOOL_TAGS, TagProtocol
from .base import RewardFunction, Sample
from .text import strip_blocks


@dataclass(frozen=True)
class ToolCall:
    """One tool call: the tool's ``name`` (``None`` when unreadable), its ``arguments`` as text (for duplicate
    detection), whether the call was ``invalid`` and whether the environment reported the tool ``unknown``."""

    name: str | None
    arguments: str
    invalid: bool = False
    unknown: bool = False


def _squash(text: str) -> str:
    return " ".join(text.split())


def _is_error(content: Any) -> bool:
    if isinstance(content, Mapping):
        return "error" in content
    if not isinstance(content, str) or "error" not in content:
        return False
    for loader in (json.loads, ast.literal_eval):
        try:
            value = loader(content)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        return isinstance(value, Mapping) and "error" in value
    return False


_ANY_BLOCK = re.compile(r"<([A-Za-z_][\w-]*)>(.*?)</\1>", re.DOTALL)


def _calls_from_trajectory(sample: Sample, think_tag: str | None) -> list[ToolCall]:
    trajectory = sample.trajectory
    calls = []
    for action, info in zip(trajectory.actions, map(read_info, trajectory.turn_infos)):
        names, invalid, unknown = info.tool, bool(info.invalid), bool(info.unknown_tool)
        name = names[-1] if names else None  # a tag environment calls one tool per turn
        if name is None and not (invalid or unknown):
            continue  # a turn without a call (e.g. the final answer)
        blocks = [m for m in _ANY_BLOCK.finditer(action) if m.group(1) != think_tag]
        if name is not None:
            blocks = [m for m in blocks if m.group(1) == name]
        if blocks:
            name, arguments = blocks[-1].group(1), blocks[-1].group(2)
        else:
            arguments = strip_blocks(action, [think_tag] if think_tag else [])
        # An unknown tool is penalized as unknown, not a second time as invalid.
        calls.append(ToolCall(name, _squash(arguments), invalid and not unknown, unknown))
    return calls


def _calls_from_messages(messages: Sequence[Mapping[str, Any]]) -> list[ToolCall]:
    calls: list[ToolCall] = []
    pending: list[int] = []  # indices of calls still waiting for their tool message
    for message in messages:
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                function = call.get("function", call)
                arguments = function.get("arguments", "")
                if not isinstance(arguments, str):
                    arguments = json.dumps(arguments, sort_keys=True, default=str)
                pending.append(len(calls))
                calls.append(ToolCall(function.get("name"), _squash(arguments)))
        elif message.get("role") == "tool" and pending:
            index = pending.pop(0)
            if _is_error(message.get("content")):
                calls[index] = ToolCall(calls[index].name, calls[index].arguments, invalid=True)
    return calls


def _calls_from_text(text: str, tool_tags: Sequence[str]) -> list[ToolCall]:
    if not tool_tags:
        return []
    pattern = re.compile(r"<(" + "|".join(re.escape(t) for t in tool_tags) + r")>(.*?)</\1>", re.DOTALL)
    return [ToolCall(m.group(1), _squash(m.group(2)), invalid=not m.group(2).strip()) for m in pattern.finditer(text)]


def extract_tool_calls(sample: Sample, protocol: TagProtocol = ANY_TOOL_TAGS) -> list[ToolCall]:
    """The tool calls of a completion, in order (sources and their priority in the module docstring)."""
    if sample.trajectory is not None:
        return _calls_from_trajectory(sample, protocol.think)
    if not isinstance(sample.completion, str) and any(m.get("tool_calls") for m in sample.completion):
        return _calls_from_messages(sample.completion)
    return _calls_from_text(sample.model_text(protocol.observation_tags), protocol.tool_tags)


class ToolUseReward(RewardFunction):
    """ToolRL-style tool-use shaping (formula in the module docstring).

    Args:
        required_tools: Tools every task needs (overridden per row by ``required_column`` when present).
        required_column: Dataset column with the tools a row needs (a name or a list of names; ``None``/missing
            value: unknown).
        known_tools: Tools that exist; a call to any other name is unknown. ``None`` treats every name as known.
        protocol: The tag protocol: its tool tags are parsed when there is neither a trajectory nor chat messages,
            and its think tag is removed from an action that serves as a call's arguments.
        need_reward: Weight of the name-matching term.
        unknown_penalty: Penalty per call to an unknown tool.
        invalid_penalty: Penalty per invalid call.
        duplicate_penalty: Penalty per call identical to the one just before.
        clip: ``(low, high)`` bounds of the reward.
        name: ``__name__`` (metric name in TRL).
    """

    def __init__(
        self,
        required_tools: Collection[str] | None = None,
        required_column: str | None = "required_tools",
        known_tools: Collection[str] | None = None,
        protocol: TagProtocol = ANY_TOOL_TAGS,
        need_reward: float = 0.5,
        unknown_penalty: float = 0.25,
        invalid_penalty: float = 0.25,
        duplicate_penalty: float = 0.25,
        clip: tuple[float, float] = (-0.5, 0.5),
        name: str = "tool_use",
    ) -> None:
        if clip[0] > clip[1]:
            raise ValueError(f"clip must be (low, high) with low <= high, got {clip}")
        super().__init__(name)
        self.required_tools = None if required_tools is None else frozenset(required_tools)
        self.required_column = required_column
        self.known_tools = None if known_tools is None else frozenset(known_tools)
        self.protocol = protocol
        self.need_reward = need_reward
        self.unknown_penalty = unknown_penalty
        self.invalid_penalty = invalid_penalty
        self.duplicate_penalty = duplicate_penalty
        self.clip = clip

    def _required(self, sample: Sample) -> frozenset[str] | None:
        value = sample.columns.get(self.required_column) if self.required_column else None
        if value is None:
            return self.required_tools
        return frozenset([value] if isinstance(value, str) else value)

    def _known(self, name: str) -> bool:
        return self.known_tools is None or name in self.known_tools

    def score(self, sample: Sample) -> float:
        calls = extract_tool_calls(sample, self.protocol)
        unknown = [c.unknown or (c.name is not None and not self._known(c.name)) for c in calls]
        n_unknown = sum(unknown)
        n_invalid = sum(c.invalid and not u for c, u in zip(calls, unknown))
        n_duplicate = sum(a.name == b.name and a.arguments == b.arguments for a, b in itertools.pairwise(calls))
        reward = -(self.unknown_penalty * n_unknown + self.invalid_penalty * n_invalid
                   + self.duplicate_penalty * n_duplicate)
        required = self._required(sample)
        if required is not None:
            called = {c.name for c, u in zip(calls, unknown) if c.name is not None and not (u or c.invalid)}
            union = required | called
            reward += self.need_reward * (len(required & called) / len(union) if union else 1.0)
        return min(max(reward, self.clip[0]), self.clip[1])
