"""``AgenticGRPOTrainer``: TRL's GRPOTrainer with multi-turn environment rollouts.

Without ``environment=`` it is ``GRPOTrainer`` unchanged (same losses, number for number). With an environment it
passes TRL a ``rollout_func`` that runs :class:`~trl_agentic.rollout.engine.RolloutEngine`: token-exact multi-turn
episodes whose observation tokens are masked out of the policy loss, the KL and the entropy (the engine's
``env_mask`` becomes TRL's mask of trained tokens). Every TRL internal it relies on is in :mod:`trl_agentic.compat`.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import gather_object
from trl import GRPOConfig

from ..algorithms.advantages import group_advantages, zero_std_groups
from ..algorithms.kl import KL_ESTIMATORS, kl_penalty
from ..algorithms.losses import clipped_policy_loss
from ..algorithms.masked import masked_sum, zero_masked
from ..compat import GRPOTrainerBoundary, ScoredRound, TRLBatch, check_trl_version, unwrap_for_generation
from ..environment import EnvironmentFactory
from ..native_tools import ensure_response_parser
from ..rewards.guard import guard_reward
from ..rollout.audit import unsampled_trained
from ..rollout.engine import RolloutConfig, RolloutEngine
from ..rollout.generation import Generator, HFGenerator
from ..rollout.metrics import logprob_gap, metrics_from_sums, rollout_sums
from ..rollout.vllm import TRLVLLMGenerator
from ..trackers import trajectory_columns
from ..trajectory import Trajectory, save_trajectories
from .checks import DegenerateStepMonitor, DegenerateTrainingError, keyword_arguments, run_construction_checks
from ..trl_environments import TRLEnvironments, from_trainer_kwargs, trl_trainer_kwargs, with_message_completions
from .zero_variance import merge_rounds, pick_groups

ZERO_VARIANCE_POLICIES = ("keep", "std_floor", "dynamic_sampling")
CLIPPED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # the loss types of AgenticGRPOTrainer.clipped_loss


@dataclass
class AgenticGRPOConfig(GRPOConfig):
    """``GRPOConfig`` plus multi-turn rollout settings.

    Budgets: ``max_completion_length`` stays the budget of a whole trajectory (sampled and observation tokens),
    ``max_tokens_per_turn`` caps one turn, ``max_turns`` the number of model turns, ``max_observation_tokens`` one
    observation's content.

    KL (``beta``, ``kl_estimator``), on agent tokens only, with ``r = logp_ref - logp`` at tokens sampled from the
    policy (Schulman 2020, "Approximating KL divergence"). As a *loss* term (GRPO), what matters is the expected
    gradient (Tang & Munos 2025, arXiv 2506.09477), and it depends on TRL's ``use_bias_correction_kl``, which
    multiplies the term by the importance ratio ``pi / pi_old``:

    - ``use_bias_correction_kl=False``: ``k1 = -r`` has zero expected gradient (it is a reward penalty, PPO's),
      ``k2 = r^2 / 2`` gives the gradient of KL(pi || pi_ref), ``k3 = exp(r) - r - 1`` that of KL(pi_ref || pi).
    - ``use_bias_correction_kl=True`` (TRL's default): ``k1`` and ``k3`` both give the gradient of KL(pi || pi_ref)
      (the ratio turns their expectation into E_pi[k] = KL(pi || pi_ref)); ``k2`` that of E_pi[r^2 / 2].
    """

    max_turns: int = field(default=4, metadata={"help": "Most model turns per trajectory."})
    max_tokens_per_turn: int = field(default=256, metadata={"help": "Most tokens sampled in one turn."})
    rollout_mode: str = field(
        default="text",
        metadata={"help": "'text': observations continue the text (base models, Search-R1). 'chat': each "
                  "observation is a new message rendered by the chat template (instruct models)."},
    )
    observation_role: str = field(
        default="tool",
        metadata={"help": "Message role of observations in chat mode ('user' for templates without a tool role, "
                  "e.g. Gemma)."},
    )
    stop_strings: list[str] | None = field(
        default=None, metadata={"help": "Extra stop strings (the environment's own are always used)."}
    )
    max_observation_tokens: int = field(
        default=1024, metadata={"help": "Most tokens of one observation's content (the head is kept)."}
    )
    env_timeout: float = field(default=60.0, metadata={"help": "Seconds per environment reset/step/close call."})
    overlap_chunks: str = field(
        default="auto",
        metadata={"help": "Generate each turn in this many chunks so that one chunk's tool calls run while the next "
                  "generates: 'auto' (two chunks when the first turn's tools took at least a quarter of its generation time), "
                  "1 (off), or a number."},
    )
    kl_estimator: str = field(
        default="k3",
        metadata={"help": "KL estimator on agent tokens: 'k3' (TRL's), 'k2' or 'k1'. Gradient as a loss term with "
                  "use_bias_correction_kl=True (TRL's default): k1 and k3 that of KL(pi||ref), k2 that of "
                  "E_pi[(log pi/ref)^2/2]; with False: k3 that of KL(ref||pi), k2 that of KL(pi||ref), k1 zero."},
    )
    mask_observations: bool = field(
        default=True,
        metadata={"help": "Mask observation tokens out of the loss (default). False trains on them too, as in "
                  "Search-R1's masking ablation."},
    )
    mask_truncated_trajectories: bool = field(
        default=False,
        metadata={"help": "Exclude trajectories that did not end on their own (budget, environment truncation or "
                  "failure) from the loss."},
    )
    trajectory_dir: str | None = field(
        default=None,
        metadata={"help": "Append every rollout, with its rewards and advantage, to <dir>/trajectories-rank<k>.jsonl."},
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
    max_degenerate_steps: int = field(
        default=3,
        metadata={"help": "Stop training after this many generation rounds in a row in which no completion could be "
                  "scored (every trajectory ended env_error/env_timeout, or every reward was None): such a round "
                  "trains nothing. The error quotes the first failure and where the trajectories are. 0: never stop."},
    )

    def __post_init__(self) -> None:
        if self.activation_checkpointing is None:  # TRL's default sets the name transformers deprecates: pass the new
            self.activation_checkpointing = self.gradient_checkpointing  # one, so no FutureWarning nobody can act on
        super().__post_init__()
        self._check_agentic_fields()
        if (self.kl_estimator == "k1" and self.beta != 0.0 and not self.use_bias_correction_kl
                and type(self) is AgenticGRPOConfig):
            warnings.warn(
                "kl_estimator='k1' with use_bias_correction_kl=False has zero expected gradient as a GRPO loss term, "
                "so it does not pull the policy towards the reference; keep use_bias_correction_kl=True (then its "
                "gradient is that of KL(pi||ref)), use 'k3' or 'k2', or put k1 in the reward with AgenticPPOTrainer.",
                stacklevel=3,
            )
        if self.use_vllm and self.vllm_enable_sleep_mode and self.max_turns > 1:
            warnings.warn(
                "vllm_enable_sleep_mode=True: TRL puts vLLM to sleep (level 2) after every generate call, so each turn "
                "of a multi-turn rollout pushes the weights again and loses the prefix cache of the earlier turns; "
                "keep the default False unless GPU memory forces it.",
                stacklevel=3,
            )
        if not self.mask_observations:
            warnings.warn(
                "mask_observations=False: observation tokens (tool output) are trained on, as in Search-R1's "
                "ablation, which lowered its results; keep the default unless you are reproducing it.",
                stacklevel=3,
            )

    def _check_agentic_fields(self) -> None:
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
        if self.rollout_mode not in ("text", "chat"):
            raise ValueError(f"rollout_mode must be 'text' or 'chat', got {self.rollout_mode!r}")
        if self.zero_variance_groups not in ZERO_VARIANCE_POLICIES:
            raise ValueError(f"zero_variance_groups must be one of {ZERO_VARIANCE_POLICIES}, got "
                             f"{self.zero_variance_groups!r}")
        if self.zero_variance_groups == "std_floor" and self.scale_rewards != "group":
            raise ValueError("zero_variance_groups='std_floor' needs scale_rewards='group'")
        if isinstance(self.max_degenerate_steps, bool) or not isinstance(self.max_degenerate_steps, int) \
                or self.max_degenerate_steps < 0:
            raise ValueError(f"max_degenerate_steps must be an integer >= 0 (0: never stop), got "
                             f"{self.max_degenerate_steps!r}")
        self.max_tokens_per_turn = min(self.max_tokens_per_turn, self.max_completion_length)
        self.rollout_config()  # validates the budgets and stop strings

    def rollout_config(self) -> RolloutConfig:
        return RolloutConfig(
            max_turns=self.max_turns,
            max_tokens_per_turn=self.max_tokens_per_turn,
            max_completion_length=self.max_completion_length,
            rollout_mode=self.rollout_mode,
            observation_role=self.observation_role,
            stop_strings=tuple(self.stop_strings or ()),
            max_observation_tokens=self.max_observation_tokens,
            env_timeout=self.env_timeout,
            chat_template_kwargs=dict(self.chat_template_kwargs or {}),
            overlap_chunks="auto" if str(self.overlap_chunks) == "auto" else _as_int(self.overlap_chunks, "overlap_chunks"),
        )


def _as_int(value: Any, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be 'auto' or an integer, got {value!r}") from None


class AgenticGRPOTrainer(GRPOTrainerBoundary):
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
        environment: A class or zero-argument factory returning a fresh :class:`~trl_agentic.Environment` per
            trajectory. ``None`` keeps plain ``GRPOTrainer`` behaviour.
        task: Optional :class:`~trl_agentic.tasks.Task`: the model card then states its tool protocol, its prompt and
            how to run the trained agent (:mod:`trl_agentic.model_card`).
        *args, **kwargs: As ``GRPOTrainer``. ``args`` should be an :class:`AgenticGRPOConfig`.

    Reward functions receive, besides TRL's keyword arguments, ``trajectory``: the
    :class:`~trl_agentic.Trajectory` of each completion (actions, observations, turn rewards, tool infos). A reward
    that is not a finite number counts as unscorable (``None``); a trajectory whose environment failed is unscorable
    for every reward function (advantage 0, outside its group's baseline).
    """

    config_class: type = AgenticGRPOConfig  # the default config when args=None with tools=/environment_factory=

    def __init__(self, *args: Any, environment: EnvironmentFactory | None = None, task: Any = None,
                 **kwargs: Any) -> None:
        check_trl_version()
        kwargs, args = keyword_arguments(args, kwargs), ()  # GRPOTrainer's arguments, all by name
        # TRL's tools= / environment_factory= run through our engine, as native tool calls (issue 18)
        native = from_trainer_kwargs(kwargs, environment, getattr(kwargs.get("args"), "env_timeout", 60.0) / 2)
        if native is not None:  # args, get_reward columns, reward_weights, train_dataset: as TRL derives them
            environment = native
            kwargs = trl_trainer_kwargs(native, kwargs, self.config_class)
        self.environment = environment
        self.task = task
        if environment is not None:
            fields = ("trajectory", "environments") if native is not None else ("trajectory",)
            run_construction_checks(environment, args, kwargs, fields)  # trainers/checks.py: fail before training
            if kwargs.get("rollout_func") is not None:
                raise ValueError("pass either environment= or rollout_func=, not both")
            kwargs["rollout_func"] = self._agentic_rollout
            funcs = kwargs.get("reward_funcs")

            def wrap(func: Any) -> Any:  # native tool calls: completions as TRL's messages
                return guard_reward(with_message_completions(func) if native is not None else func)

            kwargs["reward_funcs"] = [wrap(f) for f in funcs] if isinstance(funcs, (list, tuple)) else wrap(funcs)
        with warnings.catch_warnings():  # TRL's "rollout_func is experimental": ours is pinned and contract-tested
            warnings.filterwarnings("ignore", message="You are using 'rollout_func'", category=UserWarning)
            super().__init__(*args, **kwargs)
        if environment is not None:
            self._check_agentic_args()
            self._degenerate = DegenerateStepMonitor(self.args.max_degenerate_steps, self.args.trajectory_dir)
        if native is not None:
            ensure_response_parser(self.processing_class)
        if self.beta != 0.0 and getattr(self.args, "kl_estimator", "k3") != "k3":
            self._check_clipped_loss_settings()

    def _check_agentic_args(self) -> None:
        if not isinstance(self.args, AgenticGRPOConfig):
            raise TypeError("environment= needs args=AgenticGRPOConfig(...) (or AgenticPPOConfig), got "
                            f"{type(self.args).__name__}")
        if self.args.mask_truncated_completions:
            raise ValueError(
                "mask_truncated_completions checks for a final EOS, which multi-turn trajectories ending at a stop "
                "string lack; use mask_truncated_trajectories=True instead"
            )

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None,
                          tags: str | list[str] | None = None, **kwargs: Any) -> None:
        """TRL's card, or, with ``task=``, one that says how to run the agent (written by TRL at each save and by
        ``push_to_hub``), on the main process, to ``<output_dir>/README.md``."""
        if self.task is None:
            return super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags, **kwargs)
        if not self.is_world_process_zero():
            return None
        from ..model_card import model_card

        tags = [tags] if isinstance(tags, str) else list(tags or [])
        os.makedirs(self.args.output_dir, exist_ok=True)
        model_card(self, self.task, model_name, dataset_name, tags).save(os.path.join(self.args.output_dir, "README.md"))
        return None

    # -- rollouts --------------------------------------------------------------------------------------------
    def _generator(self) -> Generator:
        if self.use_vllm:
            return TRLVLLMGenerator(self)
        return HFGenerator(self.model, self.processing_class, self.generation_config,
                           unwrap=lambda: unwrap_for_generation(self))

    def _sync_any(self, local_active: bool) -> bool:
        if self.accelerator.num_processes == 1:
            return local_active
        flag = torch.tensor([int(local_active)], device=self.accelerator.device)
        return bool(self.accelerator.gather(flag).sum().item())

    def _sync_max(self, local: int) -> int:
        if self.accelerator.num_processes == 1:
            return local
        value = torch.tensor([local], device=self.accelerator.device)
        return int(self.accelerator.gather(value).max().item())

    def _agentic_rollout(self, prompts: list[Any], trainer: Any = None) -> dict[str, Any]:
        """TRL's ``rollout_func``: run the episodes and hand TRL ids, logprobs, the env mask and the trajectories
        (which reach the reward functions as ``trajectory``)."""
        engine = RolloutEngine(self._generator(), self.processing_class, self.environment,
                               self.args.rollout_config(), self._sync_any, eos_token_ids=self.eos_token_ids,
                               sync_max=self._sync_max)
        native = isinstance(self.environment, TRLEnvironments)
        envs = [self.environment() for _ in prompts] if native else None
        trajectories = engine.run(prompts, [dict(row) for row in self.rollout_rows()], environments=envs)
        self._log_rollout_metrics(trajectories)
        if self.args.log_completions:  # trl_agentic/trackers.py: turns, tools, observations in the completions table
            self.log_completion_columns(trajectory_columns(trajectories))
        rollout = self._to_trl_rollout(trajectories)
        if envs is not None:  # TRL's reward functions read each rollout's environment instance
            rollout["environments"] = [env.instance for env in envs]
        return rollout

    def _to_trl_rollout(self, trajectories: list[Trajectory]) -> dict[str, Any]:
        completion_ids, env_mask, logprobs = [], [], []
        pad_id = self.processing_class.pad_token_id
        for t in trajectories:
            ids, mask, lps = list(t.completion_ids), list(t.env_mask), list(t.logprobs)
            if not self.args.mask_observations:
                mask = [1] * len(mask)
            if not ids:  # TRL needs one position per row; a masked pad token trains nothing
                ids, mask, lps = [pad_id], [0], [0.0]
            if t.env_failed or (self.args.mask_truncated_trajectories and t.truncated):
                mask = [0] * len(mask)
            completion_ids.append(ids)
            env_mask.append(mask)
            logprobs.append(lps)
        return {
            "prompt_ids": [t.prompt_ids for t in trajectories],
            "completion_ids": completion_ids,
            "logprobs": logprobs if self.use_vllm else None,
            "env_mask": env_mask,
            "trajectory": trajectories,
        }

    def _log_rollout_metrics(self, trajectories: list[Trajectory]) -> None:
        total: Counter = Counter()
        for sums in gather_object([rollout_sums(trajectories)]):
            total.update(sums)
        for name, value in metrics_from_sums(total).items():
            self.log_metric(name, value)

    # -- scoring (hooks of the boundary) ---------------------------------------------------------------------
    def reward_adjustment(self, rewards_per_func: torch.Tensor, rows: list[dict[str, Any]]) -> torch.Tensor:
        """A trajectory whose environment failed carries no learning signal: unscorable for every function."""
        if self.environment is None:
            return rewards_per_func
        failed = torch.tensor([bool(row["trajectory"].env_failed) for row in rows], device=rewards_per_func.device)
        failed = self.accelerator.gather(failed)
        rewards_per_func = rewards_per_func.clone()
        rewards_per_func[failed] = torch.nan
        return rewards_per_func

    def training_batch(self, rows: list[dict[str, Any]]) -> TRLBatch:
        scored = self._scored_round(rows)
        policy = getattr(self.args, "zero_variance_groups", "keep")
        if policy == "std_floor":
            group = self.num_generations if self.model.training else self.num_generations_eval  # as TRL groups
            advantages = group_advantages(
                scored.rewards_per_func, self.reward_weights, group, self.multi_objective_aggregation,
                self.scale_rewards, self.args.std_floor,
            )
            scored.batch.advantages = self._local(advantages).to(scored.batch.advantages.device)
        if policy == "dynamic_sampling" and self.model.training:
            return self._dynamic_sampling(rows, scored)
        self._record(scored)
        return scored.batch

    def _scored_round(self, rows: list[dict[str, Any]]) -> ScoredRound:
        scored = self.score_round(rows)
        if self.environment is not None:
            self._log_mask_audit(scored)
            if self.model.training:  # trainers/checks.py: stop a run that can only train on nothing
                unscorable = torch.isnan(scored.rewards_per_func).all(dim=1).tolist()
                stop = self._degenerate.observe(unscorable, scored.trajectories)
                if stop is not None:
                    self._record(scored)
                    raise DegenerateTrainingError(stop)
        if scored.batch.old_logps is not None and scored.batch.sampling_logps is not None:
            self._log_logprob_gap(scored.batch)
        return scored

    def _local(self, global_values: torch.Tensor) -> torch.Tensor:
        """This process's slice of a tensor over the global batch."""
        local = len(global_values) // self.accelerator.num_processes
        start = self.accelerator.process_index * local
        return global_values[start : start + local]

    def _global_rewards(self, scored: ScoredRound) -> torch.Tensor:
        """Weighted sum of the reward functions, per completion of the global batch (NaN-skipping)."""
        weights = self.reward_weights.to(scored.rewards_per_func.device)
        return (scored.rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)

    def _groups_without_spread(self, scored: ScoredRound) -> torch.Tensor:
        """Per group of the global batch: no reward spread among its scorable completions (``zero_std_groups``)."""
        rewards = self._global_rewards(scored)
        rewards[torch.isnan(scored.rewards_per_func).all(dim=1)] = torch.nan  # unscorable: out, not 0
        return zero_std_groups(rewards, self.num_generations)

    def _dynamic_sampling(self, rows: list[dict[str, Any]], first: ScoredRound) -> TRLBatch:
        """DAPO dynamic sampling; see :mod:`trl_agentic.trainers.zero_variance`. Every process runs the same number
        of rounds (the decision reads the gathered rewards), so collective calls stay aligned."""
        group = self.num_generations
        self._record(first)
        rounds, keeps = [first.batch], [~self._groups_without_spread(first)]
        needed = keeps[0].numel()
        for extra in range(self.args.max_extra_generation_rounds):
            if sum(int(k.sum()) for k in keeps) >= needed:
                break
            scored = self._scored_round(self._sample_more_rows(len(rows), extra))
            self._record(scored)
            rounds.append(scored.batch)
            keeps.append(~self._groups_without_spread(scored))
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
        self.log_metric("agentic/zero_variance/dropped_groups", float(sum(int((~k).sum()) for k in keeps)))
        self.log_metric("agentic/zero_variance/extra_rounds", float(len(rounds) - 1))
        self.log_metric("agentic/zero_variance/shortfall_groups", float(max(0, needed - kept)))
        return merged

    def _sample_more_rows(self, local_size: int, extra_round: int) -> list[dict[str, Any]]:
        """Fresh rows for a dynamic-sampling round, laid out as TRL's sampler lays them out (each prompt
        ``num_generations`` times in a row over the global batch); the same draw on every process."""
        generator = torch.Generator().manual_seed(self.args.seed * 1_000_003 + self.state.global_step * 101 + extra_round)
        num_groups = local_size * self.accelerator.num_processes // self.num_generations
        indices = torch.randint(len(self.train_dataset), (num_groups,), generator=generator).tolist()
        rows = [dict(self.train_dataset[i]) for i in indices for _ in range(self.num_generations)]
        start = self.accelerator.process_index * local_size
        return rows[start : start + local_size]

    def _log_mask_audit(self, scored: ScoredRound) -> None:
        """Count trained positions the model did not sample (:mod:`trl_agentic.rollout.audit`): must be 0.
        Logged as ``agentic/mask_audit``. With ``mask_observations=False`` observation positions are allowed."""
        trained = scored.batch.loss_mask.bool().cpu().tolist()
        bad = 0
        for row, t in zip(trained, scored.trajectories):
            if not self.args.mask_observations:
                row = [flag and (i >= len(t.env_mask) or t.env_mask[i] == 1) for i, flag in enumerate(row)]
            bad += unsampled_trained(t, row, self.eos_token_ids)
        total = self.accelerator.gather(torch.tensor([bad], device=self.accelerator.device)).sum().item()
        self.log_metric("agentic/mask_audit", float(total))

    def _log_logprob_gap(self, batch: TRLBatch) -> None:
        """The trainer/vLLM log-prob gap on trained (agent) tokens, over all processes
        (:func:`~trl_agentic.rollout.metrics.logprob_gap`): ``agentic/vllm_logprob_gap`` (mean |delta| per token) and
        ``agentic/vllm_logprob_gap_max``."""
        mask = batch.loss_mask
        mean, largest = logprob_gap(batch.old_logps, batch.sampling_logps, mask)
        count = float(mask.sum())
        local = torch.tensor([[mean * count, count, largest]], device=self.accelerator.device)
        total = self.accelerator.gather(local)
        self.log_metric("agentic/vllm_logprob_gap", (total[:, 0].sum() / total[:, 1].sum().clamp(min=1.0)).item())
        self.log_metric("agentic/vllm_logprob_gap_max", total[:, 2].max().item())

    def _record(self, scored: ScoredRound) -> None:
        """Append the round's trajectories, with their rewards and advantage, to ``trajectory_dir``."""
        directory = getattr(self.args, "trajectory_dir", None)
        if not directory or not scored.trajectories:
            return
        rewards = self._local(scored.rewards_per_func).cpu()
        total = self._local(self._global_rewards(scored)).cpu()
        advantages = scored.batch.advantages.detach().float().cpu()
        if advantages.dim() == 2:  # per-token (PPO): the mean over trained tokens
            mask = scored.batch.loss_mask.cpu()
            advantages = masked_sum(advantages, mask, dim=1) / mask.sum(1).clamp(min=1)
        names = list(self.reward_func_names)
        path = os.path.join(directory, f"trajectories-rank{self.accelerator.process_index}.jsonl")
        save_trajectories(scored.trajectories, path, extra={
            "step": self.state.global_step,
            "reward": [None if torch.isnan(rewards[i]).all() else float(total[i]) for i in range(len(total))],
            "rewards": [{n: (None if torch.isnan(v) else float(v)) for n, v in zip(names, r)} for r in rewards],
            "advantage": [float(a) for a in advantages],
        })

    # -- loss (hook of the boundary) -------------------------------------------------------------------------
    def loss(self, model: Any, batch: TRLBatch) -> torch.Tensor:
        """GRPO's loss. With ``kl_estimator="k3"`` (or ``beta=0``) it is TRL's code untouched
        (:meth:`~trl_agentic.compat.GRPOTrainerBoundary.trl_loss`); with ``k1``/``k2`` it is
        :meth:`clipped_loss` with that estimator (TRL's loss hard-codes k3)."""
        estimator = getattr(self.args, "kl_estimator", "k3")
        if self.beta == 0.0 or estimator == "k3":
            return self.trl_loss(model, batch)
        return self.clipped_loss(model, batch, kl_estimator=estimator)

    def clipped_loss(self, model: Any, batch: TRLBatch, kl_estimator: str | None = None) -> torch.Tensor:
        """The clipped policy loss with an optional KL term, as TRL 1.16's ``_compute_loss`` computes it for the
        clipped loss types (``grpo``, ``bnpo``, ``dr_grpo``, ``dapo``, ``luspo``), with any KL estimator. With
        importance ratio ``rho_t = pi(y_t)/pi_old(y_t)`` (per token, or ``exp(mean_t log rho_t)`` per sequence for
        ``importance_sampling_level="sequence"``, GSPO), advantage ``A`` (per sequence, GRPO's, or per token, PPO's)
        and trained tokens ``m_t`` (sampled tokens only, observations excluded):

            L = agg_t m_t [ -min(rho_t A, clip(rho_t, 1-eps_low, 1+eps_high) A) * w_t + beta * KL_t * (rho_t) ]

        ``w_t`` is vLLM's importance-sampling correction when TRL applies it; the factor ``rho_t`` on the KL term
        only with ``use_bias_correction_kl``; ``KL_t = kl_penalty(logp, logp_ref, kl_estimator)`` (Schulman 2020)
        with ``r = logp_ref - logp``; ``agg`` per ``loss_type`` (:meth:`aggregate_like_trl`). With ``kl_estimator="k3"``
        this equals TRL's loss (a contract test checks every clipped loss type). Masked positions read the policy's
        own log-probs (ratio 1, KL 0), so a non-finite value there never reaches the loss or its gradient.
        """
        mask = batch.loss_mask.bool()
        logps, entropies = self.logps_and_entropies(model, batch)
        ratio = self.importance_weights(logps, batch)
        advantages = batch.advantages if batch.advantages.dim() == 2 else batch.advantages.unsqueeze(1)
        if advantages.size(1) > 1:
            advantages = zero_masked(advantages, mask)
        per_token = clipped_policy_loss(ratio, advantages, self.epsilon_low, self.epsilon_high)
        correction = batch.data.get("importance_sampling_ratio")
        if correction is not None:
            per_token = per_token * torch.where(mask, correction, torch.ones_like(correction))
        if kl_estimator is not None:
            ref = torch.where(mask, batch.ref_logps, logps.detach())
            per_token_kl = kl_penalty(logps, ref, kl_estimator)
            if self.args.use_bias_correction_kl:
                per_token_kl = per_token_kl * ratio
            per_token = per_token + self.beta * per_token_kl
        clipped = ((ratio < 1 - self.epsilon_low) & (advantages < 0)) | ((ratio > 1 + self.epsilon_high) & (advantages > 0))
        logged = {"entropy": entropies, "clip_ratio/region_mean": clipped.float()}
        if kl_estimator is not None:
            logged["kl"] = per_token_kl
        for name, value in self._global_token_means(logged, mask).items():
            self.log_metric(name, value)
        return self.aggregate_like_trl(per_token, mask, batch)

    def _global_token_means(self, per_token: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, float]:
        """Each term's mean over the trained tokens of all processes, in one reduction (a (B, 1) term counts once
        per trained token)."""
        sums = [masked_sum(value.detach().expand_as(mask), mask) for value in per_token.values()]
        total = self.accelerator.reduce(torch.stack([*sums, mask.sum().float()]), reduction="sum")
        count = total[-1].clamp(min=1.0)
        return {name: (total[k] / count).item() for k, name in enumerate(per_token)}

    def _check_clipped_loss_settings(self) -> None:
        """:meth:`clipped_loss` implements TRL's clipped loss types and none of TRL's loss extras: refuse, before
        training, a setting it would ignore."""
        args = self.args
        if self.loss_type not in CLIPPED_LOSS_TYPES:
            raise ValueError(f"{self._clipped_loss_user()} supports loss_type in {CLIPPED_LOSS_TYPES}, got "
                             f"{self.loss_type!r}")
        unsupported = {
            "delta": args.delta is not None,
            "top_entropy_quantile": args.top_entropy_quantile < 1.0,
            "off_policy_mask_threshold": args.off_policy_mask_threshold is not None,
            "entropy_coef": args.entropy_coef != 0.0 or args.use_adaptive_entropy,
            "router_aux_loss_coef (a mixture-of-experts model)": self.aux_loss_enabled,
        }
        for name, used in unsupported.items():
            if used:
                raise ValueError(f"{self._clipped_loss_user()} does not support {name}; leave it at TRL's default")

    def _clipped_loss_user(self) -> str:
        return f"kl_estimator={getattr(self.args, 'kl_estimator', 'k3')!r}"
