"""What a trainer given ``agent=`` checks before training (each a one-line error naming the fix), and the reward
functions it wraps."""

from __future__ import annotations

from typing import Any

from ..rewards.guard import guard_reward
from ..trainers.checks import _columns, check_prompt_column, check_reward_signatures
from .runner import Agent

REWARD_FIELDS = ("trajectory", "agent_output")
"""What an agent rollout adds to the reward functions' keyword arguments."""


def prepare_agent_kwargs(agent: Any, environment: Any, kwargs: dict[str, Any]) -> Agent:
    """Check ``GRPOTrainer``'s keyword arguments ``kwargs`` for a run with ``agent=`` and guard its reward functions
    (a raising or non-finite reward counts as unscorable, as with environments); returns the :class:`Agent`."""
    agent = Agent.of(agent)
    given = [name for name, value in (("environment", environment), ("tools", kwargs.get("tools")),
                                      ("environment_factory", kwargs.get("environment_factory")),
                                      ("rollout_func", kwargs.get("rollout_func"))) if value is not None]
    if given:
        raise ValueError(f"pass either agent= or {given[0]}=, not both: the agent runs its own loop and tools")
    config = kwargs.get("args")
    if getattr(config, "zero_variance_groups", "keep") == "dynamic_sampling":
        raise ValueError("zero_variance_groups='dynamic_sampling' is not supported with agent=; use 'keep' or "
                         "'std_floor'")
    datasets = {"train_dataset": kwargs.get("train_dataset")}
    evals = kwargs.get("eval_dataset")
    datasets.update({f"eval_dataset[{k!r}]": v for k, v in evals.items()} if isinstance(evals, dict)
                    else {"eval_dataset": evals})
    for name, dataset in datasets.items():
        if dataset is not None:
            check_prompt_column(dataset, name)
            agent.check_columns(_columns(dataset), name)
    funcs = kwargs.get("reward_funcs")
    check_reward_signatures(funcs, datasets["train_dataset"], extra_fields=REWARD_FIELDS)
    guarded = [guard_reward(f) for f in funcs] if isinstance(funcs, (list, tuple)) else guard_reward(funcs)
    kwargs["reward_funcs"] = guarded
    return agent
