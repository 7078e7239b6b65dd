"""What a reward function receives for a batch of trajectories: one function, used by training and evaluation.

TRL 1.16 calls every reward function as ``func(prompts=..., completions=..., completion_ids=..., **columns)``
(``GRPOTrainer._calculate_rewards``); a reward model (a model id or an ``nn.Module``) scores ``prompt +
completion`` rendered by its chat template. :func:`reward_inputs` builds ``prompts`` and ``completions`` exactly as
TRL 1.16 builds them for the same episodes:

- ``prompts``: each trajectory's prompt with the text ``reset()`` returned appended (TRL appends it to the last user
  message, :attr:`~trl_agentic.Trajectory.prompt`);
- ``completions``, text prompts: the completion's text, special tokens skipped (``batch_decode``);
- ``completions``, chat prompts with native tool calls: the messages of the rollout, each assistant turn as the
  response template parsed it and the ``tool`` messages after it (:attr:`~trl_agentic.Trajectory.messages`), as
  TRL's tool loop builds them;
- ``completions``, other chat prompts: one assistant message, read by the tokenizer's response template when it
  has one (``parse_response``), else the decoded text (TRL's ``_generate`` on a ``rollout_func``'s ids).

The rollout adds ``trajectory`` (and, for TRL's ``environment_factory``, ``environments``: each rollout's
environment instance; for an agent, ``agent_output``) beside the dataset columns
(:meth:`~trl_agentic.rollout.seam.RolloutSeam.reward_inputs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..rollout.observations import is_conversational
from ..rollout.seam import RolloutSeam
from ..trajectory import Trajectory


def reward_completions(trajectories: Sequence[Trajectory], processing_class: Any) -> list[Any]:
    """The ``completions`` TRL 1.16 gives reward functions for these trajectories (module docstring)."""
    from ..compat import parse_response

    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    parses = getattr(tokenizer, "response_template", None) is not None or \
        getattr(tokenizer, "response_schema", None) is not None
    completions: list[Any] = []
    for t in trajectories:
        if not is_conversational(t.prompt):
            completions.append(tokenizer.decode(t.completion_ids, skip_special_tokens=True))
        elif t.messages:
            completions.append([dict(m) for m in t.messages])
        elif parses:
            completions.append([parse_response(tokenizer, t.completion_ids, t.prompt_ids, [])])
        else:
            completions.append([{"role": "assistant",
                                 "content": tokenizer.decode(t.completion_ids, skip_special_tokens=True)}])
    return completions


def reward_inputs(seam: RolloutSeam, rows: Sequence[dict[str, Any]], runs: Sequence[Trajectory],
                  environments: Sequence[Any] | None,
                  processing_class: Any) -> tuple[list[Any], list[Any], list[dict[str, Any]]]:
    """``prompts``, ``completions`` and, per run, the keyword arguments the rollout adds to its dataset row, for the
    runs a rollout seam returned for ``rows`` (with ``environments``, TRL's instances):
    :meth:`~trl_agentic.rollout.seam.RolloutSeam.reward_inputs` (the prompt with the text ``reset()`` returned for
    the engine's runs, the row's prompt for an agent's, as TRL gives a ``rollout_func``'s) and
    :func:`reward_completions`."""
    prompts, extras = seam.reward_inputs(rows, runs, environments)
    return prompts, reward_completions(runs, processing_class), extras
