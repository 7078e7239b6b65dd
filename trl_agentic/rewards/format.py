"""Format shaping: how well a completion follows the tag protocol, as a score in [0, 1].

The protocol (configurable tag names, :class:`~trl_agentic.environments.tag_protocol.TagProtocol`)::

    think -> (tool call -> observation -> think)* -> answer

e.g. Search-R1: ``<think>..</think><search>q</search><information>..</information><think>..</think>
<answer>x</answer>``, with nothing but whitespace between tags. With ``think=None`` (ReTool style) free text takes
the place of the think blocks: text is allowed before the first tag and after each observation.

Partial credit (:func:`check_format`): the score is the mean of four criteria, each in [0, 1]:

* ``balanced``: fraction of the tag names present whose opening and closing counts match;
* ``order``: fraction of the tags, in order, accepted by the protocol before the first out-of-place tag;
* ``clean``: fraction of the between-tag gaps (before the first tag, after each closing tag) holding only
  whitespace;
* ``answer``: 1 when there is exactly one answer block and it is the last tag, else 0.

A text with no protocol tag scores 0. The score is 1 exactly when the sequence is valid, and then it coincides
with Search-R1's ``is_valid_sequence`` (v0.3 ``qa_em_format.py``) for the Search-R1 tags.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..environments.tag_protocol import RETOOL_TAGS, SEARCH_R1_TAGS, TagProtocol
from .base import RewardFunction, Sample

__all__ = ["FormatReport", "FormatReward", "ProtocolFormatReward", "RETOOL_TAGS", "SEARCH_R1_TAGS", "TagProtocol",
           "check_format"]


@dataclass(frozen=True)
class FormatReport:
    """The result of :func:`check_format`: the four criteria, their mean ``score``, ``valid`` (score == 1) and the
    first violation found (``""`` when valid)."""

    balanced: float
    order: float
    clean: float
    answer: float
    error: str

    @property
    def score(self) -> float:
        return (self.balanced + self.order + self.clean + self.answer) / 4

    @property
    def valid(self) -> bool:
        return self.score == 1.0


# Protocol states are (kind, tag): kind in start, think, after_think, tool, after_tool, obs, after_obs, answer,
# after_answer; for the "inside" kinds (think, tool, obs, answer) the tag is the open tag's name.
_State = tuple[str, str]
_INSIDE = ("think", "tool", "obs", "answer")


def _open_action(protocol: TagProtocol, name: str) -> _State | None:
    if name in protocol.tools:
        return ("tool", name)
    if name == protocol.answer:
        return ("answer", name)
    return None


def _next_state(protocol: TagProtocol, state: _State, tag: str) -> _State | None:
    kind, current = state
    closing = tag.startswith("</")
    name = tag.strip("</>")
    if kind in _INSIDE:
        return ("after_" + kind, current) if closing and name == current else None
    if closing:
        return None
    if kind in ("start", "after_obs"):
        if protocol.think is not None:
            return ("think", name) if name == protocol.think else None
        return _open_action(protocol, name)
    if kind == "after_think":
        return _open_action(protocol, name)
    if kind == "after_tool":
        return ("obs", name) if name == protocol.tools[current] else None
    return None  # after_answer: nothing may follow


def check_format(text: str, protocol: TagProtocol = SEARCH_R1_TAGS) -> FormatReport:
    """Score how well ``text`` (model text and observations, in order) follows the protocol; see the module
    docstring for the criteria."""
    parts = protocol.tag_pattern().split(text)
    gaps, tags = parts[0::2], parts[1::2]
    if not tags:
        return FormatReport(0.0, 0.0, 0.0, 0.0, "no protocol tags")
    errors: list[str] = []

    present = [n for n in protocol.names if f"<{n}>" in tags or f"</{n}>" in tags]
    unbalanced = [n for n in present if tags.count(f"<{n}>") != tags.count(f"</{n}>")]
    if unbalanced:
        errors.append(f"unbalanced tags: {unbalanced}")
    balanced = 1 - len(unbalanced) / len(present)

    state: _State = ("start", "")
    accepted = 0
    for tag in tags:
        following = _next_state(protocol, state, tag)
        if following is None:
            errors.append(f"unexpected {tag} after state {state[0]}")
            break
        state, accepted = following, accepted + 1
    order = accepted / len(tags)

    observation_closers = {f"</{o}>" for o in protocol.observation_tags}
    outside = stray = 0
    for i, gap in enumerate(gaps):
        previous = tags[i - 1] if i else None
        if previous is not None and not previous.startswith("</"):
            continue  # inside a block: any content is allowed
        if protocol.think is None and (previous is None or previous in observation_closers):
            continue  # free reasoning text takes the place of a think block
        outside += 1
        if gap.strip():
            stray += 1
            errors.append(f"text outside tags: {gap.strip()[:40]!r}")
    clean = 1 - stray / outside if outside else 1.0

    single_answer = tags.count(f"<{protocol.answer}>") == 1 and tags.count(f"</{protocol.answer}>") == 1
    answer = float(single_answer and tags[-1] == f"</{protocol.answer}>")
    if not answer:
        errors.append("no single final answer block")
    return FormatReport(balanced, order, clean, answer, errors[0] if errors else "")


class FormatReward(RewardFunction):
    """Shaping reward: :func:`check_format` score in [0, 1] of the completion (model text and observations).

    Args:
        protocol: The tag protocol (default Search-R1's).
        name: ``__name__`` (metric name in TRL).
    """

    def __init__(self, protocol: TagProtocol = SEARCH_R1_TAGS, name: str = "format") -> None:
        super().__init__(name)
        self.protocol = protocol

    def score(self, sample: Sample) -> float:
        return check_format(sample.text, self.protocol).score



def observation_block(observation: str, protocol: TagProtocol) -> str:
    """The ``<obs>...</obs>`` block of an observation without the text around it (chat-template tokens in chat mode,
    Search-R1's blank lines), closed again when the token budget cut its end; ``""`` for an observation with no
    protocol block (a corrective message after an invalid action)."""
    for tag in protocol.observation_tags:
        start = observation.find(f"<{tag}>")
        if start >= 0:
            end = observation.find(f"</{tag}>", start)
            return observation[start : end + len(tag) + 3] if end >= 0 else observation[start:] + f"</{tag}>"
    return ""


class ProtocolFormatReward(FormatReward):
    """:class:`FormatReward` over what the model wrote and the bare observation blocks.

    With a trajectory, the scored text is the model's actions interleaved with only the ``<obs>...</obs>`` block of
    each observation (:func:`observation_block`). In chat mode an observation carries the template's tokens (end of
    the assistant turn, the tool role header), which :class:`FormatReward` would count as stray text on every tool
    call; corrective messages after an invalid action are the environment's text, not the model's. Both are left
    out, so the score measures the model's protocol. Without a trajectory it is :class:`FormatReward`.
    """

    def score(self, sample: Sample) -> float:
        t = sample.trajectory
        if t is None:
            return super().score(sample)
        parts = []
        for k, action in enumerate(t.actions):
            parts.append(action)
            observation = t.observations[k] if k < len(t.observations) else None
            if observation:
                parts.append(observation_block(observation, self.protocol))
        return check_format("".join(parts), self.protocol).score
