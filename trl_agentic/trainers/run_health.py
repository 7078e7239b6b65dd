"""What a run that loses trajectories, or cannot learn, says while it trains: one line each, never a dump.

Two readers of a round's values, both pure over what every process gathered (so every rank decides the same; the
trainer prints on the main process only):

- :func:`~trl_agentic.rollout.metrics.failure_line`: the trajectories of a round whose environment or agent failed
  (they train nothing: each costs its own row), counted by stop reason, with one error quoted: one line per round
  that has any.
- :class:`RunHealth`: warnings for a run that trains on nothing although nothing fails, each given once per run
  after ``window`` rounds in a row:

  * every group's rewards were equal (GRPO: ``frac_reward_zero_std == 1``; one sample per prompt: the batch's
    rewards were all equal): every advantage is 0 (Shao et al. 2024, GRPO's ``A_i = (r_i - mean r) / std r``);
  * no trajectory called a tool although tools were offered: the model does not write calls the environment reads;
  * every trajectory was cut by a budget (``max_tokens``, ``max_turns``): no episode finishes.

  Each names the likely cause and what to change.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from ..trajectory import ENV_FAILURES

BUDGET_STOPS = ("max_tokens", "max_turns")
"""Stop reasons of a trajectory cut by a budget (``env_truncated`` is the environment's own limit)."""


class RunHealth:
    """Warnings for a run that cannot learn (module docstring), from each round's summed rollout counts and its
    logged metrics.

    Args:
        window: Rounds in a row before a warning (``0``: never warn).
        budgets: The budgets a truncation warning quotes, e.g. ``"max_completion_length=4, max_tokens_per_turn=4"``.
    """

    def __init__(self, window: int, budgets: str) -> None:
        self.window = window
        self.budgets = budgets
        self.in_a_row: Counter = Counter()
        self.given: set[str] = set()
        self._stops: Counter = Counter()

    def observe(self, sums: Mapping[str, float] | None, metrics: Mapping[str, float]) -> list[str]:
        """Count one round; return the warnings due now (each at most once per run).

        Args:
            sums: The round's rollout counts summed over every process
                (:func:`~trl_agentic.rollout.metrics.rollout_sums`: ``count``, ``tool_turns``, ``tool_calls/*``,
                ``native_tool_calls``, ``stop/<reason>``).
            metrics: The round's logged metrics (``reward``, ``reward_std``, ``frac_reward_zero_std``).
        """
        sums = sums or {}
        if self.window <= 0 or not sums.get("count"):
            return []
        failed = sum(sums.get(f"stop/{reason}", 0) for reason in ENV_FAILURES)
        scorable = sums["count"] - failed
        calls = sum(v for k, v in sums.items() if k.startswith("tool_calls/")) + sums.get("native_tool_calls", 0)
        cut = sum(sums.get(f"stop/{reason}", 0) for reason in BUDGET_STOPS)
        spread = metrics.get("frac_reward_zero_std")
        conditions = {
            "no_spread": scorable > 0 and (spread == 1.0 if spread is not None else metrics.get("reward_std") == 0.0),
            "no_tool_call": scorable > 0 and sums.get("tool_turns", 0) > 0 and calls == 0,
            "all_cut": scorable > 0 and cut == scorable,
        }
        if conditions["all_cut"]:
            self._stops = Counter({reason: sums.get(f"stop/{reason}", 0) for reason in BUDGET_STOPS})
        warnings = []
        for name, holds in conditions.items():
            self.in_a_row[name] = self.in_a_row[name] + 1 if holds else 0
            if holds and self.in_a_row[name] >= self.window and name not in self.given:
                self.given.add(name)
                warnings.append(self._message(name, metrics))
        return warnings

    def _message(self, name: str, metrics: Mapping[str, float]) -> str:
        rounds = "1 round" if self.window == 1 else f"{self.window} rounds in a row"
        if name == "no_spread":
            reward = metrics.get("reward")
            value = f" (all {reward:.3g})" if isinstance(reward, float) else ""
            return (f"every group's rewards were equal{value} for {rounds}: every advantage is 0 and nothing is "
                    "learned. If every sample fails, the task is too hard for the model as it starts: warm it up "
                    "with SFT (trl_agentic.sft) or give partial credit (CompositeReward); if every sample succeeds, "
                    "it is too easy; raise num_generations or the temperature for more varied samples")
        if name == "no_tool_call":
            return (f"no trajectory called a tool for {rounds}, although tools were offered: the model does not "
                    "write calls the environment reads. Check that the prompt shows the tools (the chat template "
                    "renders them: tokenizer.apply_chat_template(..., tools=...)), that the model's calls parse "
                    "(agentic/invalid_per_trajectory, tools/failure_frequency), or warm the model up with SFT on "
                    "tool calls (trl_agentic.sft)")
        stops = ", ".join(f"{reason} {int(n)}" for reason, n in self._stops.items() if n)
        return (f"every trajectory was cut by a budget for {rounds} ({stops}): no episode finishes, so the reward "
                f"never sees an answer. The budgets: {self.budgets}; raise the one that cuts them "
                "(max_tokens: max_tokens_per_turn or max_completion_length; max_turns: max_turns)")
