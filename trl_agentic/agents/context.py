"""How long a sequence the policy takes: the endpoint's length limit, read from the model behind the generator.

A request whose conversation (with the ids the turn would be forced to open with) does not leave the model one
position to generate is answered 400 ``context_length_exceeded`` naming both numbers
(:class:`~trl_agentic.agents.session.Session`), before anything is generated, and a turn never samples past the last
position: a prompt past what the model was built for would be generated from anyway by rotary models (and crash one
with learned positions), and trained on. The number is, in order:

- vLLM's ``max_model_length`` (TRL's ``vllm_max_model_length``) when one is set: the engine refuses longer prompts;
- the model config's maximum positions: ``max_position_embeddings`` (``n_positions``, ``max_sequence_length``,
  ``seq_length`` for the families that name it so), of the text model for multimodal configs.

TRL 1.16's GRPO config has no ``max_prompt_length``; ``Agent(max_prompt_tokens=...)`` caps the prompt of a new segment
further. A generator that holds no model config (a custom backend) sets no limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

POSITION_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""The config fields that name a model's maximum positions, in the order they are read."""


@dataclass(frozen=True)
class ContextLimit:
    """The longest sequence (prompt and generated ids) the policy takes, and where that number comes from."""

    positions: int
    source: str


def context_limit(generator: Any) -> ContextLimit | None:
    """The :class:`ContextLimit` of the model behind a generation backend (module docstring), or ``None``. Reads the
    library's generators: :class:`~trl_agentic.rollout.generation.HFGenerator` and the process generator
    (``model``), TRL's vLLM backend through the trainer (``trainer.vllm_generation``) or directly (``backend``), and
    wrappers that hold another (``inner``)."""
    inner = getattr(generator, "inner", None)
    if inner is not None:
        return context_limit(inner)
    trainer = getattr(generator, "trainer", None)
    backend = getattr(generator, "backend", None) or getattr(trainer, "vllm_generation", None)
    length = getattr(backend, "max_model_length", None)
    if isinstance(length, int) and length > 0:
        return ContextLimit(length, "vLLM's max_model_length, TRL's vllm_max_model_length")
    for owner in (generator, backend, trainer):
        limit = model_positions(getattr(owner, "model", None))
        if limit is not None:
            return limit
    return None


def model_positions(model: Any) -> ContextLimit | None:
    """The maximum positions in a model's config (of its text model), or ``None`` when it names none."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    for name in POSITION_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return ContextLimit(value, f"{name} in the model's config")
    return None
