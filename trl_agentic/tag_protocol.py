"""A text tag protocol, written once and shared by the environment that serves it and the rewards that score it.

The protocol (Search-R1, ReTool and their kin)::

    think -> (tool call -> observation -> think)* -> answer

e.g. Search-R1: ``<think>..</think><search>q</search><information>..</information><think>..</think>
<answer>x</answer>``. :class:`~trl_agentic.TagEnvironment` serves the tool tags and stops generation after each
closing tool or answer tag; :class:`~trl_agentic.rewards.FormatReward`, :class:`~trl_agentic.rewards.ToolUseReward`
and the answer-reading rewards read the same object.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TagProtocol:
    """Tag names of a text protocol.

    Attributes:
        think: Reasoning tag, or ``None`` when reasoning is free text (ReTool).
        tools: Tool-call tag -> the tag its observation is wrapped in (``{"search": "information"}``,
            ``{"code": "interpreter"}``).
        answer: Final-answer tag; an answer ends the episode.
    """

    think: str | None = "think"
    tools: Mapping[str, str] = field(default_factory=lambda: {"search": "information"})
    answer: str = "answer"

    def __post_init__(self) -> None:
        names = [self.answer, *self.tools, *self.tools.values(), *([self.think] if self.think else [])]
        bad = [n for n in names if not isinstance(n, str) or not re.fullmatch(r"[A-Za-z_][\w-]*", n)]
        if bad:
            raise ValueError(f"tag names must be identifiers such as 'search', got {bad}")
        if self.answer in self.tools:
            raise ValueError(f"the answer tag {self.answer!r} cannot also be a tool tag")

    @property
    def tool_tags(self) -> tuple[str, ...]:
        return tuple(self.tools)

    @property
    def observation_tags(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.tools.values()))

    @property
    def names(self) -> tuple[str, ...]:
        """Every tag name of the protocol, once, in protocol order."""
        names = ([self.think] if self.think else []) + list(self.tools) + list(self.observation_tags) + [self.answer]
        return tuple(dict.fromkeys(names))

    @property
    def stop_strings(self) -> list[str]:
        """Where a turn ends: after each closing tool tag and the closing answer tag."""
        return [f"</{tag}>" for tag in (*self.tools, self.answer)]

    def tag_pattern(self) -> re.Pattern[str]:
        """Matches any opening or closing tag of the protocol, captured whole."""
        return re.compile("(</?(?:" + "|".join(re.escape(n) for n in self.names) + ")>)")

    def action_pattern(self) -> re.Pattern[str]:
        """Matches the first complete tool-call or answer block: group 1 the tag, group 2 the content."""
        tags = "|".join(re.escape(t) for t in (*self.tools, self.answer))
        return re.compile(rf"<({tags})>(.*?)</\1>", re.DOTALL)


SEARCH_R1_TAGS = TagProtocol(think="think", tools={"search": "information"}, answer="answer")
"""Search-R1 (arXiv 2503.09516): ``<think>``, ``<search>`` -> ``<information>``, ``<answer>``."""

RETOOL_TAGS = TagProtocol(think=None, tools={"code": "interpreter"}, answer="answer")
"""ReTool (arXiv 2504.11536): free reasoning, ``<code>`` -> ``<interpreter>``, ``<answer>``."""

ANY_TOOL_TAGS = TagProtocol(think="think", tools={"search": "information", "code": "interpreter"}, answer="answer")
"""Both: Search-R1's and ReTool's tool tags; the default of the rewards that read tags."""
