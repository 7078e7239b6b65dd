"""A toy tool task small enough for a random 2-layer model to learn on a CPU.

Each question asks for the value stored under a key. The ``<lookup>`` tool returns that value in
``<result>...</result>``; the agent must call it and copy the value into ``<answer>...</answer>``. Without the
tool the value cannot be known: it is drawn at random for every row, independently of the key, so the best a model
can do alone is guess one of ``num_values`` values. A rising success rate means the agent learned to use the tool
and to read its observation.
"""

from __future__ import annotations

import random
from typing import Any

from ..environments.base import read_info
from ..environments.tag_environment import TagEnvironment
from ..environments.tag_protocol import TagProtocol

LOOKUP_TAGS = TagProtocol(think=None, tools={"lookup": "result"}, answer="answer")
"""The lookup task's protocol: ``<lookup>`` -> ``<result>``, ``<answer>``."""


def make_lookup_dataset(n: int = 64, seed: int = 0, num_values: int = 10, conversational: bool = False) -> list[dict]:
    """Rows ``{"prompt", "key", "value"}``: ``key`` is one of ``k00`` ... ``k99`` (fixed width, so that copying it
    is the same skill for every key), ``value`` one of ``num_values`` numbers drawn independently of the key."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        key = f"k{rng.randint(0, 99):02d}"
        value = str(rng.randint(0, num_values - 1))
        text = f"find key {key}"
        prompt: Any = [{"role": "user", "content": text}] if conversational else text + "\n"
        rows.append({"prompt": prompt, "key": key, "value": value})
    return rows


class LookupEnvironment(TagEnvironment):
    """``<lookup>{key}</lookup>`` returns ``<result>{value}</result>`` for the row's key and ``<result>not
    found</result>`` for any other; ``<answer>`` ends the episode."""

    def __init__(self) -> None:
        super().__init__(
            tools={"lookup": self._lookup},
            protocol=LOOKUP_TAGS,
            observation_template="<{tag}>{content}</{tag}>",
            invalid_message="<result>invalid</result>",
            tool_timeout=5.0,
        )
        self.key = self.value = ""

    def reset(self, **example: Any) -> None:
        super().reset(**example)
        self.key, self.value = str(example.get("key", "")), str(example.get("value", ""))
        return None

    def _lookup(self, query: str) -> str:
        return self.value if query.strip() == self.key else "not found"


def lookup_reward(completions: list[Any], value: list[str], trajectory: list[Any] | None = None, **_: Any) -> list[float]:
    """Milestone reward for the lookup task, dense enough for a random model to find a first signal.

    0.2 for a first turn that makes a complete ``<lookup>...</lookup>`` call; after such a call, 0.1 for opening
    ``<answer>``, 0.2 more for closing it, and 0.5 more when the answer is the value (1.0 in all). Reads the model's
    own text (``trajectory.actions``) when available, so a value that only appears in an observation never counts.
    """
    rewards = []
    for i, completion in enumerate(completions):
        if trajectory is not None:
            actions = trajectory[i].actions
        else:
            actions = [completion if isinstance(completion, str) else completion[-1]["content"]]
        called = bool(actions) and "<lookup>" in actions[0] and "</lookup>" in actions[0].split("<lookup>", 1)[1]
        opened, answer = False, None
        for action in actions[1:] if called else []:
            if "<answer>" in action:
                opened = True
                rest = action.split("<answer>", 1)[1]
                if "</answer>" in rest:
                    answer = rest.split("</answer>", 1)[0].strip()
                break
        reward = 0.2 * called + 0.1 * opened + 0.2 * (answer is not None) + 0.5 * (answer == value[i])
        rewards.append(float(reward))
    return rewards


def lookup_success(completions: list[Any], value: list[str], trajectory: list[Any], **_: Any) -> list[float]:
    """The task's outcome: 1.0 when the agent called ``<lookup>`` and then answered the row's value, else 0.0."""
    rewards = []
    for t, expected in zip(trajectory, value):
        called = any("lookup" in read_info(info).tool for info in t.turn_infos)
        answered = t.stop_reason == "terminated" and t.turn_infos[-1].get("answer") == str(expected)
        rewards.append(float(called and answered))
    return rewards
