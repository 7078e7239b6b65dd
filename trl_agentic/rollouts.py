"""``run_rollouts``: one trajectory per dataset row, with the engine the trainers use, whatever the kind of rollout.

The trainers, ``evaluate``, the SFT helpers and this function take the same rollout arguments under the same names
(:mod:`~trl_agentic.kinds.entry`): ``environment=`` (a trl-agentic environment class or factory),
``environment_factory=`` (TRL's environment class), ``tools=`` (TRL's tool functions) or ``agent=`` (an agent of
any framework, through the OpenAI-compatible endpoint).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .environments.base import EnvironmentFactory
from .kinds.entry import entry_rollout
from .rollout.config import RolloutConfig
from .rollout.generation import Generator, HFGenerator, get_eos_token_ids
from .trajectory import Trajectory


def run_rollouts(
    model: Any,
    processing_class: Any,
    environment: EnvironmentFactory | None = None,
    rows: Sequence[dict[str, Any]] | None = None,
    *,
    environment_factory: Any = None,
    tools: Sequence[Callable[..., Any]] | None = None,
    agent: Any = None,
    prompt_column: str = "prompt",
    config: RolloutConfig | None = None,
    generator: Generator | None = None,
    generation_config: Any = None,
    **config_kwargs: Any,
) -> list[Trajectory]:
    """Roll out one trajectory per dataset row with the same engine the trainers use.

    Args:
        model: A causal LM (ignored when ``generator`` is given).
        processing_class: Its tokenizer.
        environment: Class or zero-argument factory of a trl-agentic environment; or, by name, TRL's
            ``environment_factory=`` / ``tools=``, or ``agent=`` (module docstring).
        rows: Dataset rows (a list of dicts or a ``datasets.Dataset``); ``row[prompt_column]`` is the prompt (text or
            chat messages) and the whole row is passed to ``reset`` (or to the agent).
        prompt_column: The column that holds each row's prompt.
        config: A :class:`RolloutConfig`; or pass its fields as keyword arguments (``max_turns=3``, ...). Fields left
            out take what the kind implies, as in training (chat rollouts for native tool calls, TRL's tool-loop
            budgets for TRL's tools).
        generator: Override the generation backend (defaults to :class:`HFGenerator` with sampling and log-probs).
        generation_config: transformers ``GenerationConfig`` for the default generator (default: the model's, with
            sampling on). Its ``eos_token_id`` (every end id) is where turns end, with a given ``generator`` too
            (pass it with a vLLM generator: the model's end ids are in its generation config, not its tokenizer).

    Raises:
        TypeError, ValueError: one line naming the fix (as :func:`~trl_agentic.evaluate.evaluate`).
    """
    if rows is None:
        raise TypeError("run_rollouts() needs rows=: the dataset rows to roll out (a list of dicts or a Dataset)")
    rows = [dict(row) for row in rows]
    rollout = entry_rollout("run_rollouts", processing_class, rows,
                            {"environment": environment, "environment_factory": environment_factory, "tools": tools,
                             "agent": agent}, config, config_kwargs, prompt_column=prompt_column)
    if generator is None:
        generator = HFGenerator(model, processing_class, generation_config, return_logprobs=True,
                                keep_cache=rollout.config.prefix_caching,
                                max_cached_tokens=rollout.config.max_cached_tokens)
    eos = get_eos_token_ids(processing_class, generation_config if generation_config is not None
                            else getattr(generator, "generation_config", None))
    seam = rollout.seam(processing_class, generator, eos, prompt_column)
    try:
        return seam.run(rows)[0]
    finally:
        seam.close()
