"""A tiny random model of the Qwen2.5-Instruct convention for vLLM, and a regex that makes it write native tool calls.

The model has the tokenizer and the verbatim tool-calling chat template of the ``qwen2.5-instruct`` convention
(``tests/conventions.py``), at hidden 64 with 2 heads (head_dim 32: vLLM's CPU attention needs >= 32). A random model
never writes a well-formed ``<tool_call>{json}</tool_call>`` by chance, so the tests and the benchmark constrain
every turn with vLLM's structured outputs (:data:`TURN_REGEX`, TRL's ``vllm_structured_outputs_regex``): the turn is
a call, and the model samples the tool name (``add``, or ``sub``, which does not exist) and each argument (a digit,
or for ``a`` a quoted letter: the wrong type). What the tool
loops then parse, run and append is whatever vLLM sampled inside that grammar.

Used by ``tests/vllm_engine`` and ``benchmarks/vllm_tool_loop.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

TURN_REGEX = r'<tool_call>\n\{"name": "(add|sub)", "arguments": \{"a": ([0-9]|"[a-z]"), "b": [0-9]\}\}\n</tool_call>'
"""One turn: a call of ``add`` (or of the unknown ``sub``; ``a`` may be a string). Calls only: offered an answer
branch too (``|The answer is [0-9]+``), the random model took it on every first turn (that branch starts with many
allowed tokens, a call with one), so no call was ever made. Rollouts end at the turn limit."""


def add(a: int, b: int) -> int:
    """
    Adds two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The sum of the two integers.
    """
    return a + b


def question(a: int, b: int) -> list[dict[str, str]]:
    """The prompt of one task, as a chat."""
    return [{"role": "user", "content": f"What is {a} plus {b}?"}]


def build_tool_calling_model(path: str | Path, seed: int = 0) -> str:
    """Save the random model, its generation config and its tokenizer to ``path``; returns ``path`` as a string."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    sys.path.insert(0, str(Path(__file__).parent))
    from conventions import build_convention

    conv = build_convention("qwen2.5-instruct")
    config = AutoConfig.from_pretrained(conv.model_dir)
    config.update(dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=2,
                       head_dim=32))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = conv.generation_config
    model.save_pretrained(path)
    conv.load_tokenizer().save_pretrained(path)
    return str(path)


def tool_dataset(n: int) -> Any:
    """``n`` rows of :func:`question` (a ``datasets.Dataset``) with the sum as ``answer``."""
    from datasets import Dataset

    pairs = [(i % 7 + 1, i % 5 + 2) for i in range(n)]
    return Dataset.from_dict({"prompt": [question(a, b) for a, b in pairs], "answer": [a + b for a, b in pairs]})
