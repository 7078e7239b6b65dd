"""SFT rows and datasets: a :class:`~trl_agentic.Trajectory` as one pre-tokenized row of TRL's ``SFTTrainer``, in
the rollout engine's own token layout, so that what SFT trains is, token for token, what RL later samples and trains.

RL from outcome rewards cannot start when no sample of a group is ever right (every advantage is 0). ReTool
(arXiv 2504.11536) and DeepSeek-R1 (arXiv 2501.12948) start from a cold-start SFT stage on tool-using traces.

A trajectory (a demonstration replayed by :mod:`trl_agentic.sft.demonstrations`, or a rollout from
:func:`~trl_agentic.run_rollouts`) becomes one row: ``input_ids = prompt_ids + completion_ids`` and ``labels``, the
id where the loss mask is 1 and -100 elsewhere; the loss mask is 0 on the prompt and ``env_mask`` on the completion (1
on sampled tokens, 0 on observation tokens). ``SFTTrainer`` uses a ``labels`` column as is, so observation and prompt
tokens carry no loss whatever ``completion_only_loss`` says. (No ``completion_mask`` column: in TRL that name is a
padding/prompt mask, and ``SFTTrainer`` drops it when ``labels`` are given.) ``mask_observations=False`` trains on observation tokens
too (Search-R1's ablation, arXiv 2503.09516: it lowered EM from 0.431 to 0.343), with a warning, as
``AgenticGRPOConfig`` does.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from typing import Any

from ..environments.base import EnvironmentFactory
from ..environments.tag_protocol import SEARCH_R1_TAGS, TagProtocol
from ..environments.trl_environments import EMPTY_PROMPT
from ..kinds.entry import entry_rollout
from ..rollout.config import RolloutConfig
from ..trajectory import Trajectory
from .agent_demonstrations import AgentReplay
from .demonstrations import transcript_to_trajectory

__all__ = ["sft_dataset", "trajectory_to_sft_example"]

UNMASKED_WARNING = (
    "mask_observations=False: observation tokens (tool output) are trained on, as in Search-R1's ablation, which "
    "lowered its results; keep the default unless you are reproducing it."
)


def trajectory_to_sft_example(trajectory: Trajectory, mask_observations: bool = True) -> dict[str, list[int]]:
    """One pre-tokenized ``SFTTrainer`` row (see the module docstring): ``input_ids`` and ``labels`` (-100 where the
    loss mask is 0).

    Raises:
        ValueError: the trajectory's environment failed, or it has no token to train.
    """
    if not mask_observations:
        warnings.warn(UNMASKED_WARNING, stacklevel=2)
    if trajectory.env_failed:
        raise ValueError(f"the trajectory's environment failed ({trajectory.stop_reason}: {trajectory.error}); "
                         "it carries nothing to imitate")
    if len(trajectory.env_mask) != len(trajectory.completion_ids):
        raise ValueError(f"env_mask has {len(trajectory.env_mask)} entries for {len(trajectory.completion_ids)} "
                         "completion ids")
    completion_loss_mask = list(trajectory.env_mask) if mask_observations else [1] * len(trajectory.completion_ids)
    if not any(completion_loss_mask):
        raise ValueError("the trajectory has no sampled token to train on")
    input_ids = list(trajectory.prompt_ids) + list(trajectory.completion_ids)
    loss_mask = [0] * len(trajectory.prompt_ids) + completion_loss_mask
    return {"input_ids": input_ids, "labels": [token if keep else -100 for token, keep in zip(input_ids, loss_mask)]}


def sft_dataset(
    examples: Iterable[Trajectory | dict[str, Any]],
    processing_class: Any = None,
    *,
    mask_observations: bool = True,
    environment: EnvironmentFactory | None = None,
    environment_factory: Any = None,
    tools: Sequence[Any] | None = None,
    agent: Any = None,
    protocol: TagProtocol | None = SEARCH_R1_TAGS,
    generation_config: Any = None,
    config: RolloutConfig | None = None,
    prompt_column: str = "prompt",
    completion_column: str = "completion",
    show_progress: bool = True,
    **config_kwargs: Any,
) -> Any:
    """A ``datasets.Dataset`` of pre-tokenized rows (``input_ids``, ``labels``) for TRL's
    ``SFTTrainer``.

    Args:
        examples: :class:`~trl_agentic.Trajectory` objects (e.g. the successful rollouts of
            :func:`rejection_sampling`), and/or prompt-completion rows (``{"prompt", "completion", ...}``; the whole
            row reaches the environment's ``reset``), converted by :func:`transcript_to_trajectory`.
        processing_class: The policy's tokenizer (needed for prompt-completion rows).
        mask_observations: Keep observation tokens out of the loss (default); ``False`` trains on them (warns).
        environment, environment_factory, tools, agent: What RL will roll out, as the trainers take it
            (:mod:`~trl_agentic.kinds.entry`): prompt-completion rows are replayed against it, so that each SFT row
            has the token layout RL samples from (the prompt with ``reset()``'s text and the tools' schemas, the
            real tool results; an agent's requests as its endpoint renders them). Without any, a demonstration's
            observations are its own (a tool-calling trace's schemas from its row's ``tools`` column).
        protocol, generation_config: For prompt-completion rows, as in :func:`transcript_to_trajectory`.
        config: A :class:`~trl_agentic.RolloutConfig` (use RL's), or its fields as keyword arguments; those left
            out take what the kind implies, as in training (chat rollouts for native tool calls).
        show_progress: A progress bar over the examples.

    An example that cannot be converted (a bad demonstration, a failed trajectory) is skipped; a warning gives the
    count and the first reason. Raises ``ValueError`` when nothing is left.
    """
    from datasets import Dataset

    items = list(examples)
    rollout = {"environment": environment, "environment_factory": environment_factory, "tools": tools,
               "agent": agent}
    agent_replay = None
    if any(value is not None for value in rollout.values()):
        demonstrations = [item for item in items if isinstance(item, dict)]  # checked as RL's rows
        entry = entry_rollout("sft_dataset", processing_class, demonstrations or None, rollout, config,
                              config_kwargs, prompt_column=prompt_column)
        config, replay = entry.config, entry.choice.environment_factory()
        if replay is None:  # an agent: demonstrations run through the agent itself
            agent_replay = AgentReplay(processing_class, entry, generation_config, prompt_column, completion_column)
    else:
        config, replay = RolloutConfig.from_arguments(config, config_kwargs), None
    if not mask_observations:
        warnings.warn(UNMASKED_WARNING, stacklevel=2)
    if show_progress:
        from tqdm.auto import tqdm

        items = tqdm(items, desc="building SFT rows", unit="example")
    rows, skipped = [], []
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="mask_observations=False")
            for k, example in enumerate(items):
                try:
                    if isinstance(example, Trajectory):
                        trajectories = [example]
                    elif agent_replay is not None and isinstance(example, dict):
                        trajectories = agent_replay(example)
                    else:
                        trajectories = [_row_to_trajectory(example, processing_class, replay, protocol,
                                                           generation_config, config, prompt_column,
                                                           completion_column)]
                    rows += [trajectory_to_sft_example(t, mask_observations) for t in trajectories]
                except (ValueError, KeyError, TypeError) as exc:
                    skipped.append(f"example {k}: {exc}")
    finally:
        if agent_replay is not None:
            agent_replay.close()
    if skipped:
        warnings.warn(f"sft_dataset skipped {len(skipped)} of {len(rows) + len(skipped)} examples; first: "
                      f"{skipped[0]}", stacklevel=2)
    if not rows:
        raise ValueError("sft_dataset: no example could be converted" + (f" ({skipped[0]})" if skipped else ""))
    return Dataset.from_list(rows)


def _row_to_trajectory(row, processing_class, environment, protocol, generation_config, config, prompt_column,
                       completion_column):
    if not isinstance(row, dict):
        raise TypeError(f"an example must be a Trajectory or a prompt-completion dict, not {type(row).__name__}")
    if processing_class is None:
        raise TypeError("prompt-completion rows need processing_class= (the policy's tokenizer)")
    prompt = row.get(prompt_column, EMPTY_PROMPT) if environment is not None else row[prompt_column]
    return transcript_to_trajectory(processing_class, prompt, row[completion_column],
                                    environment=environment, row=row, protocol=protocol,
                                    generation_config=generation_config, config=config, tools=row.get("tools"))
