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

    def split_transcript(self, text: str) -> tuple[list[str], list[str | None]]:
        """Split a text-mode transcript (everything after the prompt) into actions and the observations after them.

        An action ends at the first of :attr:`stop_strings` (``</search>``, ``</answer>``); after a tool call comes
        its observation block (``<information>...</information>``, with the whitespace around it), or nothing (the
        next action starts at once: the observation is ``None``, to be computed by an environment). The final
        action may end at the closing answer tag or at the end of the text.

        Returns:
            ``(actions, observations)`` with ``len(observations) == len(actions) - 1``.

        Raises:
            ValueError: text after the final answer, an observation block of the wrong tag, or a transcript that
                ends with an observation.
        """
        stops = re.compile("|".join(re.escape(s) for s in self.stop_strings))
        answer_close = f"</{self.answer}>"
        actions: list[str] = []
        observations: list[str | None] = []
        position = 0
        while position < len(text):
            match = stops.search(text, position)
            if match is None:  # a last action without a closing tag
                actions.append(text[position:])
                break
            actions.append(text[position : match.end()])
            position = match.end()
            if match.group(0) == answer_close:
                if text[position:].strip():
                    raise ValueError(f"text after the final {answer_close}: {text[position:position + 60]!r}")
                break
            if not text[position:].strip():
                break
            tag = self.tools[match.group(0)[2:-1]]
            block = re.compile(rf"\s*<{re.escape(tag)}>.*?</{re.escape(tag)}>\s*", re.DOTALL).match(text, position)
            if block is None and re.match(r"\s*<(?:" + "|".join(map(re.escape, self.observation_tags)) + ")>",
                                          text[position:]):
                raise ValueError(f"after {match.group(0)} the observation must be <{tag}>...</{tag}>: "
                                 f"{text[position:position + 60]!r}")
            observations.append(block.group(0) if block else None)
            position = block.end() if block else position
        if len(observations) == len(actions):  # the transcript ended on a tool call's observation
            raise ValueError("the transcript ends with an observation; end it with the model's final action")
        return actions, observations


SEARCH_R1_TAGS = TagProtocol(think="think", tools={"search": "information"}, answer="answer")
"""Search-R1 (arXiv 2503.09516): ``<think>``, ``<search>`` -> ``<information>``, ``<answer>``."""

RETOOL_TAGS = TagProtocol(think=None, tools={"code": "interpreter"}, answer="answer")
"""ReTool (arXiv 2504.11536): free reasoning, ``<code>`` -> ``<interpreter>``, ``<answer>``."""

ANY_TOOL_TAGS = TagProtocol(think="think", tools={"search": "information", "code": "interpreter"}, answer="answer")
"""Both: Search-R1's and ReTool's tool tags; the default of the rewards that read tags."""
