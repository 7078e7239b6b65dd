"""A toy task for native tool calls: ``add(a, b)`` as TRL's ``tools=`` take a tool, questions that need it, and a
reward.

The examples of the README and the docs that give a model tools natively (TRL's ``tools=``, ``trl-agentic grpo
--tools``, an agent's ``tools``) run on it offline with :func:`~trl_agentic.toy.save_tiny_model`, whose chat
template (Qwen2.5-Instruct's) renders the tool's schema and whose calls TRL parses.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def make_addition_dataset(n: int = 8, seed: int = 0) -> list[dict[str, Any]]:
    """Rows ``{"prompt": [{"role": "user", "content": "What is 12 plus 7?"}], "answer": "19"}``: TRL's
    conversational prompts, the two numbers drawn from 0 to 99."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        rows.append({"prompt": [{"role": "user", "content": f"What is {a} plus {b}?"}], "answer": str(a + b)})
    return rows


def save_addition_dataset(folder: str, n: int = 8, seed: int = 0) -> str:
    """Write :func:`make_addition_dataset`'s rows to ``folder/train.jsonl``, which ``datasets.load_dataset(folder)``
    (and so ``--dataset_name folder``) reads as the ``train`` split; returns ``folder``."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "train.jsonl"), "w", encoding="utf-8") as fh:
        for row in make_addition_dataset(n, seed):
            fh.write(json.dumps(row) + "\n")
    return folder


def addition_reward(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
    """1.0 when the model's last message (the last assistant message of a conversational completion) contains the
    row's answer, else 0.0."""
    rewards = []
    for completion, expected in zip(completions, answer):
        if isinstance(completion, str):
            text = completion
        else:
            text = next((m.get("content") or "" for m in reversed(completion) if m.get("role") == "assistant"), "")
        rewards.append(float(str(expected) in str(text)))
    return rewards
