"""What a run that loses trajectories, or cannot learn, says while it trains, and when it stops: one line each,
never a dump.

:class:`RunHealth` reads each round over every process (so every rank decides the same; the trainer prints on the
main process only):

- the trajectories of a round whose environment or agent failed (they train nothing: each costs its own row),
  counted by stop reason, with one error quoted (:func:`~trl_agentic.rollout.metrics.failure_line`): one line per
  round that has any;
- warnings for a run that trains on nothing although nothing fails, each given once per run after ``window``
  rounds in a row:

  * every group's rewards were equal (GRPO: ``frac_reward_zero_std == 1``; one sample per prompt: the batch's
    rewards were all equal): every advantage is 0 (Shao et al. 2024, GRPO's ``A_i = (r_i - mean r) / std r``);
  * no trajectory called a tool although tools were offered: the model does not write calls the environment reads;
  * every trajectory was cut by a budget (``max_tokens``, ``max_turns``): no episode finishes.

  Each names the likely cause and what to change;
- the message that stops the run (:class:`~trl_agentic.trainers.checks.DegenerateTrainingError`):
  ``max_degenerate_steps`` rounds in a row in which no completion could be scored, or, at once, a round of agents
  whose every request the endpoint refused.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from ..rollout.metrics import RoundFailures, failure_line
from ..trajectory import ENV_FAILURES

BUDGET_STOPS = ("max_tokens", "max_turns")
"""Stop reasons of a trajectory cut by a budget (``env_truncated`` is the environment's own limit)."""


class RunHealth:
    """What a run says while it trains, and when it stops (module docstring), from each round's values over every
    process.

    Args:
        window: Rounds in a row before a warning (``0``: never warn).
        budgets: The budgets a truncation warning quotes, e.g. ``"max_completion_length=4, max_tokens_per_turn=4"``.
        max_degenerate_steps: Rounds in a row with no scorable completion before the run stops (``0``: never stop).
        trajectory_dir: Where the trajectories are kept (the stop's message says where to read them), or ``None``.
    """

    def __init__(self, window: int, budgets: str, max_degenerate_steps: int, trajectory_dir: str | None) -> None:
        self.window = window
        self.budgets = budgets
        self.max_degenerate_steps = max_degenerate_steps
        self.trajectory_dir = trajectory_dir
        self.unscorable_in_a_row = 0
        self.in_a_row: Counter = Counter()
        self.given: set[str] = set()
        self._stops: Counter = Counter()

    def observe(self, label: str, sums: Mapping[str, float], failures: Sequence[RoundFailures], refusal: str | None,
                unscorable: bool, metrics: Mapping[str, float]) -> tuple[list[str], str | None]:
        """Read one round: the lines to print now (the failed trajectories, headed ``label``; the warnings due, each
        at most once per run) and the message that stops the run, or ``None``. Two kinds of round train nothing and
        stop the run (unless ``max_degenerate_steps=0``):

        - a round of agents in which no request reached the model and the endpoint refused some (400: e.g. tools
          with a chat template that has no response template): every later round would be refused alike, so the
          first stops the run;
        - a round in which no completion could be scored (every trajectory ended ``env_error``/``env_timeout``, or
          every reward function returned ``None``): every advantage is 0; ``max_degenerate_steps`` of them in a row
          stop the run.

        Args:
            label: The round's name in the failure line, e.g. ``"step 4"``.
            sums: The round's rollout counts summed over every process
                (:func:`~trl_agentic.rollout.metrics.rollout_sums`: ``count``, ``tool_turns``, ``tool_calls/*``,
                ``native_tool_calls``, ``stop/<reason>``; agents: ``reached_model``, ``refused``).
            failures: Every process's failed runs.
            refusal: The endpoint's message for one refused request, or ``None``.
            unscorable: Whether no completion of the round, on any process, could be scored.
            metrics: The round's logged metrics (``reward``, ``reward_std``, ``frac_reward_zero_std``).
        """
        line = failure_line(label, sums.get("count", 0), failures, " and train nothing")
        lines = [] if line is None else [line]
        self.unscorable_in_a_row = self.unscorable_in_a_row + 1 if unscorable else 0
        refused = int(sums.get("refused", 0))
        if self.max_degenerate_steps > 0 and refused and not sums.get("reached_model"):
            return lines, (f"stopped at the first generation round: the endpoint refused every request of every agent "
                           f"({refused} answered 400, none reached the model), e.g. {refusal or '(on another process)'}"
                           "; fix that and run again (max_degenerate_steps=0 turns this check off)")
        if 0 < self.max_degenerate_steps <= self.unscorable_in_a_row:
            return lines, self._unscorable_stop(failures)
        if self.window <= 0 or not sums.get("count"):
            return lines, None
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
        for name, holds in conditions.items():
            self.in_a_row[name] = self.in_a_row[name] + 1 if holds else 0
            if holds and self.in_a_row[name] >= self.window and name not in self.given:
                self.given.add(name)
                lines.append(self._message(name, metrics))
        return lines, None

    def _unscorable_stop(self, failures: Sequence[RoundFailures]) -> str:
        failed = next((f for f in failures if f.counts), None)
        if failed is not None:
            reason, error = next(iter(failed.counts)), failed.first_error or "(none)"
            cause = f"every trajectory ended {reason}; the first error: {error}"
        else:
            cause = ("every reward function returned None (or raised) for every completion; their warnings above "
                     "say why")
        where = (f"the trajectories are in {self.trajectory_dir}/trajectories-rank*.jsonl" if self.trajectory_dir
                 else "set trajectory_dir= to keep the trajectories")
        return (f"stopped after {self.unscorable_in_a_row} generation rounds in a row in which no completion could be "
                f"scored ({cause}); {where}; max_degenerate_steps=0 turns this check off")

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
