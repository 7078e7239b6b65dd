"""``AgenticGRPOTrainer``: TRL's GRPOTrainer with multi-turn environment rollouts.

Without ``environment=`` (or TRL's ``tools=`` / ``environment_factory=``, or ``agent=``) it is ``GRPOTrainer``
unchanged (same losses, number for number). With one, a generation round reads top to bottom in
:meth:`AgenticGRPOTrainer.training_batch`: rows -> runs (token-exact multi-turn episodes) -> rewards (TRL's reward
functions) -> TRL's batch (observation tokens masked out of the policy loss, the KL and the entropy) -> log-probs ->
group advantages -> metrics -> trajectories on disk. The stages shared with PPO are in
:mod:`trl_agentic.trainers.base`; every TRL internal is in :mod:`trl_agentic.compat`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import gather_object

from ..algorithms.advantages import frac_reward_zero_std, group_advantages, zero_std_groups
from ..algorithms.gigpo import anchor_groups, gigpo_advantages
from ..algorithms.kl import KL_ESTIMATORS
from ..algorithms.seats import role_advantages, seat_group_advantages
from ..compat import TRLBatch
from .base import AgenticTrainer
from .config import AgenticConfig
from .round import Round, values_of_rows
from .steps import STATE_KEYS, RunSteps, run_steps, step_tensors, token_values
from .zero_variance import merge_rounds, pick_groups

ZERO_VARIANCE_POLICIES = ("keep", "std_floor", "dynamic_sampling")
GIGPO_STEP_REWARDS = ("turns_and_outcome", "turns")
SEAT_BASELINES = ("group", "rae")


@dataclass
class AgenticGRPOConfig(AgenticConfig):
    """``GRPOConfig`` plus multi-turn rollout settings (:class:`~trl_agentic.trainers.config.AgenticConfig`) and
    GRPO's own.

    KL (``beta``, ``kl_estimator``), a *loss* term here, on agent tokens only, with ``r = logp_ref - logp`` at tokens
    sampled from the policy (Schulman 2020, "Approximating KL divergence"). What matters is its expected gradient
    (Tang & Munos 2025, arXiv 2506.09477), which depends on TRL's ``use_bias_correction_kl``, the factor
    ``pi / pi_old`` on the term:

    - ``use_bias_correction_kl=False``: ``k1 = -r`` has zero expected gradient (it is a reward penalty, PPO's),
      ``k2 = r^2 / 2`` gives the gradient of KL(pi || pi_ref), ``k3 = exp(r) - r - 1`` that of KL(pi_ref || pi).
    - ``use_bias_correction_kl=True`` (TRL's default): ``k1`` and ``k3`` both give the gradient of KL(pi || pi_ref)
      (the ratio turns their expectation into E_pi[k] = KL(pi || pi_ref)); ``k2`` that of E_pi[r^2 / 2].

    Groups whose rewards are all equal (``zero_variance_groups``): :mod:`trl_agentic.trainers.zero_variance`.

    Step-level credit (``gigpo=True``): GiGPO (Feng et al. 2025, arXiv 2505.10978) adds to GRPO's advantage
    ``A_E(tau)`` a step-level one, ``A = A_E + gigpo_step_weight * A_S``, given to each turn's tokens: the steps of a
    group's trajectories that start from the same state form a step group, and each step's discounted return
    ``R_t = sum_{k >= t} gigpo_gamma^(k - t) r_k`` is compared with its group's (``F_norm``: the step group's std with
    ``scale_rewards="group"``, 1 with ``"none"``). The math, the defaults and the state keys:
    :mod:`trl_agentic.algorithms.gigpo`, ``docs/credit.md``.

    Games with several seats (``environment=Seats(...)``, :mod:`trl_agentic.rollout.seats`): each run is one seat's
    trajectory, compared with the runs of its prompt that played its seat (``seat_baseline="group"``), or with its
    seat's moving-average baseline (``"rae"``, SPIRAL's role-conditioned advantage estimation): the math is in
    :mod:`trl_agentic.algorithms.seats`.
    """

    kl_estimator: str = field(
        default="k3",
        metadata={"help": "KL estimator of the loss term, on agent tokens: 'k3' (TRL's), 'k2' or 'k1'. Gradient with "
                  "use_bias_correction_kl=True (TRL's default): k1 and k3 that of KL(pi||ref), k2 that of "
                  "E_pi[(log pi/ref)^2/2]; with False: k3 that of KL(ref||pi), k2 that of KL(pi||ref), k1 zero."},
    )
    zero_variance_groups: str = field(
        default="keep",
        metadata={"help": "Groups whose rewards are all equal: 'keep' (log only), 'std_floor' (divide by "
                  "max(std, std_floor)) or 'dynamic_sampling' (DAPO: drop them and sample more prompts)."},
    )
    std_floor: float = field(default=0.1, metadata={"help": "Smallest group std used with 'std_floor'."})
    max_extra_generation_rounds: int = field(
        default=2, metadata={"help": "Dynamic sampling: most extra generation rounds per step."}
    )
    gigpo: bool = field(
        default=False,
        metadata={"help": "GiGPO (arXiv 2505.10978): add a step-level advantage to GRPO's, A = A_E + gigpo_step_weight "
                  "* A_S per turn, A_S each step's discounted return against those of the group's steps that start "
                  "from the same state (a state no other step reached: A_S = 0). Normalised as scale_rewards says "
                  "('group': by the step group's std; 'none': not divided). docs/credit.md."},
    )
    gigpo_step_weight: float = field(
        default=1.0, metadata={"help": "GiGPO's omega: the weight of the step-level advantage (the paper's 1.0)."}
    )
    gigpo_gamma: float = field(
        default=0.95,
        metadata={"help": "GiGPO's discount of step returns, per turn: R_t = sum_k gamma^(k-t) r_k (the paper's "
                  "runs: 0.95; 1.0 gives every step of a trajectory its whole return)."},
    )
    gigpo_state_key: str = field(
        default="history",
        metadata={"help": "GiGPO: how a state the environment gives no key for (StepInfo.state_key, a TRL class's "
                  "_state_key()) is keyed: 'history', the exact prompt and every observation before the turn; "
                  "'observation', the last observation alone (environments whose observation is their whole state)."},
    )
    seat_baseline: str = field(
        default="group",
        metadata={"help": "Games with several seats (environment=Seats(...)): what each seat's run is compared with: "
                  "'group', the runs of its prompt that played its seat (GRPO's group per prompt and seat); 'rae', "
                  "SPIRAL's role-conditioned baseline (arXiv 2506.24119), a moving average of the seat's rewards, "
                  "A = r - b_seat, not divided by a std. trl_agentic/algorithms/seats.py."},
    )
    rae_decay: float = field(
        default=0.95,
        metadata={"help": "seat_baseline='rae': the decay alpha of each seat's baseline, b <- alpha * b + (1 - alpha) * r "
                  "(SPIRAL's 0.95)."},
    )
    gigpo_step_rewards: str = field(
        default="turns_and_outcome",
        metadata={"help": "GiGPO: what a step's reward r_k is: 'turns_and_outcome', the turn's own reward plus the "
                  "reward functions' reward on the last turn (as PPO's turn-level GAE); 'turns', the turn rewards "
                  "alone, for environments whose turn rewards already hold the outcome (TextArena's game reward)."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
        if self.zero_variance_groups not in ZERO_VARIANCE_POLICIES:
            raise ValueError(f"zero_variance_groups must be one of {ZERO_VARIANCE_POLICIES}, got "
                             f"{self.zero_variance_groups!r}")
        if self.zero_variance_groups == "std_floor" and self.scale_rewards != "group":
            raise ValueError("zero_variance_groups='std_floor' needs scale_rewards='group'")
        self._check_gigpo_fields()
        if self.seat_baseline not in SEAT_BASELINES:
            raise ValueError(f"seat_baseline must be one of {SEAT_BASELINES}, got {self.seat_baseline!r}")
        if not 0.0 < self.rae_decay < 1.0:
            raise ValueError(f"rae_decay is a moving average's decay in (0, 1), got {self.rae_decay!r}")
        if self.kl_estimator == "k1" and self.beta != 0.0 and not self.use_bias_correction_kl:
            warnings.warn(
                "kl_estimator='k1' with use_bias_correction_kl=False has zero expected gradient as a GRPO loss term, "
                "so it does not pull the policy towards the reference; keep use_bias_correction_kl=True (then its "
                "gradient is that of KL(pi||ref)), use 'k3' or 'k2', or put k1 in the reward with AgenticPPOTrainer.",
                stacklevel=3,
            )

    def _check_gigpo_fields(self) -> None:
        """GiGPO's fields: each a value it takes; with ``gigpo=True``, ``scale_rewards`` its ``F_norm`` (the group's
        std or 1) and no dynamic sampling. Each refusal is one line naming what to pass."""
        if self.gigpo_state_key not in STATE_KEYS:
            raise ValueError(f"gigpo_state_key must be one of {STATE_KEYS}, got {self.gigpo_state_key!r}")
        if self.gigpo_step_rewards not in GIGPO_STEP_REWARDS:
            raise ValueError(f"gigpo_step_rewards must be one of {GIGPO_STEP_REWARDS}, got {self.gigpo_step_rewards!r}")
        if not 0.0 <= self.gigpo_gamma <= 1.0:
            raise ValueError(f"gigpo_gamma is a discount per turn in [0, 1], got {self.gigpo_gamma!r}")
        if not self.gigpo:
            return
        if self.scale_rewards not in ("group", "none"):
            raise ValueError("gigpo=True normalises each step group by its own std (scale_rewards='group') or not at "
                             f"all ('none'); got scale_rewards={self.scale_rewards!r}: pass one of them")
        if self.zero_variance_groups == "dynamic_sampling":
            raise ValueError("zero_variance_groups='dynamic_sampling' drops groups whose rewards are equal, where GiGPO's "
                             "step advantages may still differ: pass zero_variance_groups='keep' with gigpo=True")


class AgenticGRPOTrainer(AgenticTrainer):
    """GRPO over multi-turn environment rollouts; a drop-in replacement for ``GRPOTrainer``.

    Example::

        from functools import partial
        from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer, TagEnvironment
        from trl_agentic.rewards import QAReward

        trainer = AgenticGRPOTrainer(
            model="Qwen/Qwen2.5-0.5B-Instruct",
            reward_funcs=QAReward(),
            args=AgenticGRPOConfig(output_dir="out", max_turns=4, max_completion_length=1024),
            train_dataset=dataset,  # rows with "prompt" (+ any columns: they reach reset() and the rewards)
            environment=partial(TagEnvironment, tools={"search": (search, "information")}),
        )
        trainer.train()

    Args:
        environment, agent, task: See :class:`~trl_agentic.trainers.base.AgenticTrainer`.
        *args, **kwargs: As ``GRPOTrainer``. ``args`` should be an :class:`AgenticGRPOConfig` (a TRL ``GRPOConfig``
            works with TRL's ``tools=`` / ``environment_factory=``).

    Reward functions receive, besides TRL's keyword arguments, ``trajectory``: the
    :class:`~trl_agentic.Trajectory` of each completion (actions, observations, turn rewards, tool infos). A reward
    that is not a finite number counts as unscorable (``None``); a trajectory whose environment failed is unscorable
    for every reward function (advantage 0, outside its group's baseline).
    """

    config_class: type = AgenticGRPOConfig

    def _check_trl_config(self, args: Any) -> None:
        if getattr(args, "zero_variance_groups", "keep") != "keep":
            raise ValueError("zero_variance_groups applies to environment rollouts; without environment= the trainer "
                             "is TRL's GRPOTrainer: pass environment= or leave zero_variance_groups='keep'")
        if getattr(args, "gigpo", False):
            raise ValueError("gigpo=True credits the turns of rollouts; without environment= (or tools=, "
                             "environment_factory=, agent=) the trainer is TRL's GRPOTrainer: pass one or gigpo=False")

    # -- one generation round -------------------------------------------------------------------------------------
    def training_batch(self, rows: list[dict[str, Any]]) -> TRLBatch:
        """The batch of one generation round of dataset ``rows``. Without rollouts it is TRL's, untouched. With them,
        read top to bottom:

        1-4. :meth:`~trl_agentic.trainers.base.AgenticTrainer.generation_round`: the runs, their rewards, the
             training rows and TRL's batch of them, the log-probs the step needs;
        5. GRPO's group-relative advantages (:meth:`advantages`), one per run, given to its rows; with ``gigpo``,
           plus each turn's step-level advantage on its tokens (:meth:`step_advantages`);
        6. dynamic sampling (``zero_variance_groups="dynamic_sampling"``): more rounds until enough groups have a
           reward spread (:meth:`dynamic_sampling`);
        7. TRL's completions table; the trajectories to ``trajectory_dir``; the metrics, logged once, with what the
           run's health says of the round (which may stop the run).
        """
        if self.rollout_seam is None:
            return super().training_batch(rows)
        round_ = self.generation_round(rows)
        metrics = self.advantages(round_)
        if self.args.zero_variance_groups == "dynamic_sampling" and self.model.training:
            batch, sampling_metrics = self.dynamic_sampling(rows, round_)
            metrics.update(sampling_metrics)
        else:
            batch = round_.batch
            self.record(round_)
        self.log_round_metrics(round_, metrics)
        return batch

    def advantages(self, round_: Round) -> dict[str, float]:
        """GRPO's advantages (:func:`~trl_agentic.algorithms.advantages.group_advantages`, bit-equal to TRL's) over
        the runs, grouped by ``num_generations`` (``num_generations_eval`` in evaluation, as TRL), with the std floor
        under ``zero_variance_groups="std_floor"``, given to every training row of each run (padding rows: 0), set
        on the batch. Returns the round's metrics (the stage's and the reward metrics, ``frac_reward_zero_std``);
        the round goes to TRL's completions table (:meth:`~trl_agentic.trainers.base.AgenticTrainer.round_metrics`)."""
        group = self.num_generations if self.model.training else self.num_generations_eval
        floor = self.args.std_floor if self.args.zero_variance_groups == "std_floor" else 0.0
        if self.rollout_seam.trained_seats:  # a game's seats: each run against its own seat's
            per_run, seat_metrics = self.seat_advantages(round_, group, floor)
        else:
            per_run = group_advantages(round_.run_rewards, self.reward_weights, group,
                                       self.multi_objective_aggregation, self.scale_rewards, floor)
        rows = values_of_rows(self._local(per_run), round_.owners)
        step_metrics = {}
        if self.args.gigpo:
            steps, step_metrics = self.step_advantages(round_, per_run, group, floor)
            rows = rows.unsqueeze(1) + steps.to(rows.device)
        round_.batch.advantages = rows.to(round_.batch.advantages.device)
        metrics, _ = self.round_metrics(round_)
        metrics.update(step_metrics)
        metrics.update(self.reward_metrics(round_.rewards_per_func))
        if self.rollout_seam.trained_seats:
            metrics.update(seat_metrics)
        else:
            metrics["frac_reward_zero_std"] = frac_reward_zero_std(round_.run_rewards, self.reward_weights, group,
                                                                   self.multi_objective_aggregation, self.scale_rewards)
        return metrics

    def seat_advantages(self, round_: Round, group: int, floor: float) -> tuple[torch.Tensor, dict[str, float]]:
        """The advantages of a game's seats (:mod:`~trl_agentic.algorithms.seats`), global, one per run: against the
        runs of the run's prompt that played its seat (``seat_baseline="group"``: the ``group`` consecutive runs of a
        prompt split by seat), or against its seat's moving-average baseline (``"rae"``: SPIRAL's; the baselines move
        in training rounds only). Every process's runs' seats are gathered in one call (:meth:`gather_seats`).
        Returns the advantages and the metrics: ``frac_reward_zero_std`` over the groups per prompt and seat, and with
        ``"rae"`` each seat's baseline after the round (``agentic/seats/<seat>/baseline``)."""
        names = list(self.rollout_seam.trained_seats)
        seats = torch.tensor([names.index(seat) for seat in self.gather_seats([run.seat for run in round_.runs])])
        rewards = self.combined_rewards(round_.run_rewards).cpu()
        groups = torch.arange(len(rewards)) // group * len(names) + seats
        per_run, stds = seat_group_advantages(rewards, groups, self.scale_rewards, floor)
        metrics = {"frac_reward_zero_std": torch.isclose(stds, torch.zeros_like(stds)).float().mean().item()}
        if self.args.seat_baseline == "rae":
            before = getattr(self, "seat_baselines", torch.zeros(len(names)))
            per_run, after = role_advantages(rewards, seats, before, self.args.rae_decay)
            if self.model.training:
                self.seat_baselines = after
            metrics.update({f"agentic/seats/{name}/baseline": float(b) for name, b in zip(names, after)})
        return per_run.to(round_.run_rewards.device), metrics

    def gather_seats(self, local: list[str | None]) -> list[str | None]:
        """Every process's runs' seats, in rank order (the global order of the runs): the one collective call of a
        round's seat groups, made by every rank once per round of a game with several seats (from
        :meth:`seat_advantages`)."""
        return gather_object(local) if self.accelerator.num_processes > 1 else local

    def step_advantages(self, round_: Round, episode: torch.Tensor, group: int,
                        floor: float) -> tuple[torch.Tensor, dict[str, float]]:
        """GiGPO's step level (:mod:`~trl_agentic.algorithms.gigpo`) over the steps of every process's runs
        (:func:`~trl_agentic.trainers.steps.run_steps`, gathered in one call: :meth:`gather_steps`), grouped with
        the episode groups of ``episode`` (GRPO's advantages, global): ``gigpo_step_weight * A_S`` on the tokens of
        each turn of this process's training rows (B, W), and the metrics that say whether GiGPO had anything to
        group: ``gigpo/anchored_step_share`` (the steps whose state another step of their group also started from)
        and ``gigpo/step_group_size_mean`` (1: no state repeated)."""
        args = self.args
        steps = self.gather_steps([run_steps(run, args.gigpo_state_key) for run in round_.runs])
        keys, turn_rewards, step_mask = step_tensors(steps)
        outcomes = self.combined_rewards(round_.run_rewards).cpu()
        groups = anchor_groups(keys, group, (~torch.isnan(outcomes)).tolist())
        result = gigpo_advantages(episode.cpu(), outcomes, turn_rewards, step_mask, groups,
                                  weight=args.gigpo_step_weight, gamma=args.gigpo_gamma,
                                  scale=self.scale_rewards == "group", std_floor=floor,
                                  with_outcome=args.gigpo_step_rewards == "turns_and_outcome")
        weighted = self._local(args.gigpo_step_weight * result.step_advantages)
        tokens = token_values(weighted, round_.trajectories, round_.owners, round_.batch.completion_ids.size(1))
        return tokens, {"gigpo/anchored_step_share": result.anchored_share(),
                        "gigpo/step_group_size_mean": result.mean_group_size()}

    def gather_steps(self, local: list[RunSteps]) -> list[RunSteps]:
        """Every process's runs' steps, in rank order (the global order of the runs): GiGPO's one collective call
        of a round, made by every rank once per round (from :meth:`step_advantages`)."""
        return gather_object(local) if self.accelerator.num_processes > 1 else local

    # -- groups whose rewards are all equal ---------------------------------------------------------------------
    def groups_without_spread(self, round_: Round) -> torch.Tensor:
        """Per group of the global batch: no reward spread among its scorable completions (``zero_std_groups``)."""
        return zero_std_groups(self.combined_rewards(round_.run_rewards), self.num_generations)

    def dynamic_sampling(self, rows: list[dict[str, Any]], first: Round) -> tuple[TRLBatch, dict[str, float]]:
        """DAPO dynamic sampling; see :mod:`trl_agentic.trainers.zero_variance`. Every process runs the same number
        of rounds (the decision reads the gathered rewards), so collective calls stay aligned. Each extra round's
        metrics are logged with its own rows; the merged batch's are returned."""
        group = self.num_generations
        self.record(first)
        rounds, keeps = [first.batch], [~self.groups_without_spread(first)]
        needed = keeps[0].numel()
        for extra in range(self.args.max_extra_generation_rounds):
            if sum(int(k.sum()) for k in keeps) >= needed:
                break
            round_ = self.generation_round(self._sample_more_rows(len(rows), extra), ahead=False)
            metrics = self.advantages(round_)
            self.record(round_)
            self.log_round_metrics(round_, metrics)
            rounds.append(round_.batch)
            keeps.append(~self.groups_without_spread(round_))
        picked = pick_groups(keeps, needed)
        device = self.accelerator.device
        merged = merge_rounds(
            rounds, picked, group,
            gather=self.accelerator.gather,
            max_width=lambda w: int(self.accelerator.gather(torch.tensor([w], device=device)).max()),
            process_index=self.accelerator.process_index,
            pad_token_id=self.processing_class.pad_token_id,
        )
        kept = sum(int(k.sum()) for k in keeps)
        return merged, {
            "agentic/zero_variance/dropped_groups": float(sum(int((~k).sum()) for k in keeps)),
            "agentic/zero_variance/extra_rounds": float(len(rounds) - 1),
            "agentic/zero_variance/shortfall_groups": float(max(0, needed - kept)),
        }

    def _sample_more_rows(self, local_size: int, extra_round: int) -> list[dict[str, Any]]:
        """Fresh rows for a dynamic-sampling round, laid out as TRL's sampler lays them out (each prompt
        ``num_generations`` times in a row over the global batch); the same draw on every process."""
        generator = torch.Generator().manual_seed(self.args.seed * 1_000_003 + self.state.global_step * 101 + extra_round)
        num_groups = local_size * self.accelerator.num_processes // self.num_generations
        indices = torch.randint(len(self.train_dataset), (num_groups,), generator=generator).tolist()
        rows = [dict(self.train_dataset[i]) for i in indices for _ in range(self.num_generations)]
        start = self.accelerator.process_index * local_size
        return rows[start : start + local_size]

    # -- loss (hook of the boundary) ----------------------------------------------------------------------------
    def loss(self, model: Any, batch: TRLBatch) -> torch.Tensor:
        """GRPO's loss. With ``kl_estimator="k3"`` (or ``beta=0``) it is TRL's code untouched
        (:meth:`~trl_agentic.compat.GRPOTrainerBoundary.trl_loss`); with ``k1``/``k2`` it is
        :meth:`~trl_agentic.trainers.base.AgenticTrainer.clipped_loss` with that estimator (TRL's loss hard-codes
        k3), and with ``max_staleness >= 1`` (equal to TRL's for k3, with the off-policy weight, which TRL's loss
        applies only with vLLM)."""
        estimator = getattr(self.args, "kl_estimator", "k3")
        if self.off_policy:  # TRL's loss applies the importance weight with vLLM only
            return self.clipped_loss(model, batch, kl_estimator=estimator if self.beta != 0.0 else None)
        if self.beta == 0.0 or estimator == "k3":
            return self.trl_loss(model, batch)
        return self.clipped_loss(model, batch, kl_estimator=estimator)
