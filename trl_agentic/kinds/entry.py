"""What an entry point other than the trainers rolls out: ``evaluate``, ``run_rollouts``, the SFT helpers and the
command lines take the trainers' rollout arguments, under the same names, and run them through the trainers' own
choice (:func:`~trl_agentic.kinds.choice.choose_rollout`), with the same checks and one-line refusals:

- ``environment=``: a trl-agentic :class:`~trl_agentic.Environment` class or zero-argument factory;
- ``environment_factory=``: TRL's environment class (``reset`` and tool methods), or a dict of them;
- ``tools=``: TRL's list of tool functions;
- ``agent=``: an agent of any framework, ``async def agent(client, **row)``, through the OpenAI-compatible endpoint.

:func:`entry_rollout` resolves the rollout settings as the trainers do (native tool calls imply chat rollouts, TRL's
tools its tool-loop budgets, where the caller left them unset), checks the rows and the reward functions, and
returns an :class:`EntryRollout` whose :meth:`~EntryRollout.seam` runs them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from ..rollout.config import RolloutConfig
from ..rollout.generation import Generator
from ..rollout.seam import RolloutSeam
from .choice import RolloutChoice, SeamParts, choose_rollout

ROLLOUT_ARGUMENTS = ("environment", "environment_factory", "tools", "agent")
"""The names of the rollout arguments, as the trainers take them."""


@dataclass
class EntryRollout:
    """A rollout an entry point runs: the kind chosen from its arguments, its settings, and the reward functions it
    is scored with (the caller's, then what the kind adds: TRL's ``get_reward``).

    Attributes:
        choice: The kind of rollout (:mod:`~trl_agentic.kinds.choice`).
        config: The rollout settings, resolved and adapted to the tokenizer.
        reward_funcs: The reward functions, in the order their rewards are combined.
        reward_weights: One weight per reward function (TRL's ``reward_weights``; 1 each when not given).
    """

    choice: RolloutChoice
    config: RolloutConfig
    reward_funcs: list[Callable[..., Any]] = field(default_factory=list)
    reward_weights: list[float] = field(default_factory=list)

    def seam(self, processing_class: Any, generator: Generator, eos_token_ids: list[int],
             prompt_column: str = "prompt") -> RolloutSeam:
        """The rollout seam the trainers would build for this kind, on one process."""
        return self.choice.seam(SeamParts(processing_class, self.config, generator, eos_token_ids,
                                          prompt_column=prompt_column))


def entry_rollout(
    entry: str,
    processing_class: Any,
    rows: Sequence[dict[str, Any]] | None,
    rollout: dict[str, Any],
    config: RolloutConfig | None,
    config_kwargs: dict[str, Any],
    reward_funcs: Any = None,
    reward_weights: Sequence[float] | None = None,
    prompt_column: str = "prompt",
) -> EntryRollout:
    """Choose, configure and check the rollout of entry point ``entry`` (its name, for the messages).

    Args:
        entry: The entry point's name (``"evaluate"``, ``"sft_dataset"``...), named when nothing is given.
        processing_class: The policy's tokenizer.
        rows: The dataset rows the rollout will run (checked as the trainers check ``train_dataset``), or ``None``.
        rollout: ``environment``, ``environment_factory``, ``tools``, ``agent`` as given (``None``: not given).
        config, config_kwargs: A :class:`~trl_agentic.RolloutConfig`, or its fields (those left out take what the
            kind implies, then the defaults).
        reward_funcs: A reward function or a list of them (TRL's ``reward_funcs``), or ``None``.
        reward_weights: One weight per function of ``reward_funcs`` (TRL's ``reward_weights``).
        prompt_column: The column of ``rows`` that holds the prompt (the trainers' ``prompt``).

    Raises:
        TypeError, ValueError: one line naming the fix (nothing to roll out, two kinds, a wrong kind, a row or
            reward function the rollout could not use).
    """
    unknown = sorted(set(rollout) - set(ROLLOUT_ARGUMENTS))
    if unknown:
        raise TypeError(f"{entry}() got an unexpected argument {unknown[0]!r}: the rollout arguments are "
                        f"{', '.join(f'{name}=' for name in ROLLOUT_ARGUMENTS)}")
    tool_options = config if config is not None else SimpleNamespace(**config_kwargs)  # env_timeout: tool timeouts
    choice = choose_rollout(rollout.get("environment"), rollout.get("agent"),
                            {"tools": rollout.get("tools"), "environment_factory": rollout.get("environment_factory"),
                             "args": tool_options})
    if choice is None:
        raise TypeError(f"{entry}() needs something to roll out: pass environment= (a trl-agentic Environment), "
                        "environment_factory= (TRL's environment class), tools= (TRL's tool functions) or agent= "
                        "(an agent function)")
    budget = config_kwargs.get("max_completion_length") or RolloutConfig.max_completion_length
    config = RolloutConfig.from_arguments(config, config_kwargs, choice.implied_fields(budget))
    funcs = [] if reward_funcs is None else list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) \
        else [reward_funcs]
    weights = None if reward_weights is None else [float(w) for w in reward_weights]
    if weights is not None and len(weights) != len(funcs):
        raise ValueError(f"Number of reward weights ({len(weights)}) must match number of reward functions "
                         f"({len(funcs)})")
    if rows is not None:  # checked as the trainers check train_dataset, whose prompt column is "prompt"
        renamed = [{("prompt" if key == prompt_column else key): value for key, value in row.items()} for row in rows]
        choice.check({"rows": renamed}, funcs, config.rollout_mode)
    config = choice.rollout_settings(config, processing_class)
    funcs, weights = choice.reward_functions(funcs, weights)
    return EntryRollout(choice, config, funcs, weights if weights is not None else [1.0] * len(funcs))
