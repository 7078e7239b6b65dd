"""What both trainers share: the stages of a generation round with rollouts.

:class:`AgenticTrainer` is TRL's ``GRPOTrainer`` (through :class:`~trl_agentic.compat.GRPOTrainerBoundary`) plus the
stages a round of our own is made of; :class:`~trl_agentic.AgenticGRPOTrainer` and
:class:`~trl_agentic.AgenticPPOTrainer` are siblings that compose them in their ``training_batch``, read top to
bottom in one file each:

1. :meth:`~AgenticTrainer.rollout`: one run per dataset row, through the rollout seam
   (:mod:`~trl_agentic.rollout.seam`: the engine with our environments or TRL's, or agents through the endpoint);
2. :meth:`~AgenticTrainer.score`: TRL's reward functions on each run (what they receive:
   :func:`~trl_agentic.rewards.inputs.reward_inputs`, shared with evaluation);
3. :meth:`~AgenticTrainer.build_round`: the runs' training rows and TRL's batch (padding and masks only);
4. :meth:`~AgenticTrainer.add_logps`: the model forwards a round needs (old, reference and vLLM's log-probs);
5. the algorithm's advantages (the sibling's own);
6. :meth:`~AgenticTrainer.round_metrics` (computed from values gathered in one call,
   :meth:`~AgenticTrainer.gather_round_values`) and the sibling's; :meth:`~AgenticTrainer.record`; then the metrics
   logged once with what the run's health says of the round (:meth:`~AgenticTrainer.log_round_metrics`).

State: built once per run (in ``__init__``, the kind of rollout chosen once by
:func:`~trl_agentic.kinds.choice.choose_rollout`): the rollout settings
(:class:`~trl_agentic.rollout.config.RolloutConfig`), the generator (transformers' ``generate`` with its stop-criteria
cache, or TRL's vLLM backend), the rollout seam (the engine, :class:`~trl_agentic.rollout.engine.RolloutEngine`, with
its observation encoder's template probes, or the agents' endpoint), the rollout source, the run's health
(:class:`~trl_agentic.trainers.run_health.RunHealth`). Per round: everything in
:class:`~trl_agentic.trainers.round.Round`. Per optimizer step: the loss-side metrics. Across rounds: only the global
step whose weights vLLM holds, and the health's counts of rounds in a row.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import torch
from accelerate.utils import gather_object
from tqdm.contrib.logging import logging_redirect_tqdm

from ..algorithms.advantages import combined_rewards, nanstd
from ..algorithms.importance import importance_ratio, off_policy_terms, vllm_importance_sampling_ratio
from ..algorithms.kl import kl_penalty
from ..algorithms.losses import aggregate_loss, clipped_policy_loss
from ..algorithms.masked import masked_sum, zero_masked
from ..compat import GRPOTrainerBoundary, TRLBatch, check_trl_version, unwrap_for_generation, vllm_server_client
from ..environments.base import EnvironmentFactory
from ..kinds.choice import RolloutChoice, SeamParts, choose_rollout
from ..rewards.inputs import reward_inputs
from ..rollout.config import RolloutConfig
from ..rollout.generation import Generator, HFGenerator
from ..rollout.pipeline import (
    AsyncRollouts,
    CopyWeights,
    PolicyCopy,
    Rollouts,
    ServerWeights,
    StoppableGenerator,
    SyncSource,
    generator_core,
    refusal,
    sharding_of,
)
from ..rollout.process_generator import ProcessGenerator
from ..rollout.seam import RolloutSeam
from ..rollout.vllm import TRLVLLMGenerator, VLLMServerGenerator
from ..trackers import trajectory_columns
from ..trajectory import Trajectory, save_trajectories
from .checks import DegenerateTrainingError, keyword_arguments
from .config import AgenticConfig
from .metrics import LossMetrics, RoundTable, RoundValues, add_sampling_values, round_values, sampling_values, summarize
from .round import Round, pad, row_advantages, training_rows, trl_completion_rows, turn_advantages, values_of_rows
from .run_health import RunHealth

logger = logging.getLogger(__name__)

CLIPPED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # the loss types of AgenticTrainer.clipped_loss


class AgenticTrainer(GRPOTrainerBoundary):
    """The stages of a round with rollouts (module docstring), shared by the GRPO and PPO trainers. Without an
    environment or an agent it is TRL's ``GRPOTrainer``, untouched.

    Args:
        environment: A class or zero-argument factory returning a fresh :class:`~trl_agentic.Environment` per
            trajectory. ``None`` keeps plain ``GRPOTrainer`` behaviour (unless TRL's ``tools=`` /
            ``environment_factory=`` or ``agent=`` are given).
        agent: Instead of ``environment``, an agent of any framework, ``async def agent(client, **row)``, trained
            through an OpenAI-compatible endpoint in front of the policy (:mod:`trl_agentic.agents`,
            ``docs/agents.md``); reward functions also receive ``agent_output``.
        task: Optional :class:`~trl_agentic.tasks.Task`: the model card then states its tool protocol, its prompt and
            how to run the trained agent (:mod:`trl_agentic.model_card`).
        *args, **kwargs: As ``GRPOTrainer``.
    """

    config_class: type = AgenticConfig  # the default config when args=None with tools=/environment_factory=

    def __init__(self, *args: Any, environment: EnvironmentFactory | None = None, agent: Any = None,
                 task: Any = None, **kwargs: Any) -> None:
        check_trl_version()
        kwargs = keyword_arguments(args, kwargs)  # GRPOTrainer's arguments, all by name
        choice = choose_rollout(environment, agent, kwargs)  # kinds/choice.py: the one choice of kind
        if choice is None:
            self._check_trl_config(kwargs.get("args"))
        else:  # checked, rewards guarded; TRL's tools= / environment_factory=: as TRL's __init__ derives them
            kwargs = choice.trainer_kwargs(kwargs, self.config_class)
        self.task = task
        super().__init__(**kwargs)
        self._vllm_weights_step = -1  # the global step whose weights vLLM holds
        self.group_by_length = getattr(self.args, "group_by_length", False)  # the boundary's micro-batch layout
        self.rollout_seam: RolloutSeam | None = None
        self.rollout_source: SyncSource | AsyncRollouts | None = None  # rollout/pipeline.py
        self.loss_metrics = LossMetrics()  # our losses' metrics, gathered once per optimizer step
        if choice is None and getattr(self.args, "max_staleness", 0):
            raise ValueError("max_staleness applies to rollouts (environment=, tools=/environment_factory=, agent=); "
                             "without them the trainer is TRL's GRPOTrainer: pass max_staleness=0")
        if choice is not None:
            self._check_agentic_args()
            settings = choice.rollout_settings(self.args.rollout_config(), self.processing_class)
            self.health = RunHealth(self.args.health_warning_rounds,
                                    f"max_completion_length={settings.max_completion_length}, max_tokens_per_turn="
                                    f"{settings.max_tokens_per_turn}, max_turns={settings.max_turns}",
                                    self.args.max_degenerate_steps, self.args.trajectory_dir)
            pad_id = self.processing_class.pad_token_id
            self.pad_id = pad_id if pad_id is not None else self.eos_token_ids[0]  # the batch's and padding rows' id
            self.generator = self._generator(settings)
            self.rollout_seam = choice.seam(SeamParts(self.processing_class, settings, self.generator,
                                                      self.eos_token_ids, self._sync_any, self._sync_max,
                                                      self.accelerator.num_processes > 1))
            # TRL's public attributes our rollout stands in for (TRL's tool loop never runs): ``tools``, what TRL's
            # __init__ would hold (TRL's tools and every environment's methods; [] without them, TRL's value), and
            # ``environments``, this process's environment instances of the round (TRL's environment_factory; None
            # without one, TRL's value), which TRL's reward call also reads: each round's set by rollout()
            self.tools, self.environments = self.rollout_seam.tools, None
            self.rollout_source = self._rollout_source(choice, settings)
            for callback in self.rollout_source.callbacks():
                self.add_callback(callback)
        if (self.beta != 0.0 and getattr(self.args, "kl_estimator", "k3") != "k3") or self.off_policy:
            self._check_clipped_loss_settings()

    @property
    def off_policy(self) -> bool:
        """Whether the rollout source's rollouts are sampled by an earlier policy, with behaviour log-probs to
        correct against (:attr:`~trl_agentic.rollout.pipeline.AsyncRollouts.off_policy`): the loss is then
        :meth:`clipped_loss`, which applies the correction."""
        return getattr(self.rollout_source, "off_policy", False)

    def _rollout_source(self, choice: RolloutChoice, settings: RolloutConfig) -> SyncSource | AsyncRollouts:
        """The trainer's rollout source (:mod:`~trl_agentic.rollout.pipeline`), chosen once: depth 0
        (:class:`~trl_agentic.rollout.pipeline.SyncSource`: each round rolled out now through the trainer's seam,
        vLLM's weights brought up to date first), or with ``max_staleness=D >= 1`` the pipeline: a background
        generator that returns its log-probs (the behaviour policy's), a rollout seam of the same kind over it,
        without the other processes' ``sync_any`` / ``sync_max`` (no collective call on the background thread),
        and the background thread, pinned to ``generator_cpu`` plus this process's index on its machine; settings
        it cannot run are refused before training. Its generator: a copy of the policy with transformers'
        generation (``async_generator="process"``: in a child process, over the copy's weights in shared memory),
        or, with ``use_vllm=True`` (server mode), vLLM's server, sent this process's prompts, its weights pushed
        between jobs (:meth:`push_vllm_weights`)."""
        args = self.args
        present = SyncSource(self.rollout_seam, self.push_vllm_weights, behaviour=bool(args.max_staleness))
        if not args.max_staleness:
            return present
        reason = refusal(None if self.use_vllm else sharding_of(self.accelerator.state),
                         self.rollout_seam.tools_on_training_thread)
        if reason is not None:
            raise ValueError(reason)
        stop = threading.Event()
        cpu = generator_core(args.generator_cpu, self.accelerator.local_process_index, set(range(os.cpu_count() or 1)))
        process = None
        if self.use_vllm:
            inner: Generator = VLLMServerGenerator(self.vllm_generation, vllm_server_client(self.vllm_generation))
            weights: CopyWeights | ServerWeights = ServerWeights(self.push_vllm_weights)
        else:
            policy = PolicyCopy(self.accelerator.unwrap_model(self.model))
            weights = CopyWeights(policy)
            if args.async_generator == "process":  # its forward passes in a child process, weights shared
                process = ProcessGenerator(policy.model, self.processing_class, self.generation_config,
                                           return_logprobs=True, keep_cache=settings.prefix_caching, cpu=cpu,
                                           seed=args.seed, max_cached_tokens=settings.max_cached_tokens)
            inner = process if process is not None else HFGenerator(
                policy.model, self.processing_class, self.generation_config, return_logprobs=True,
                keep_cache=settings.prefix_caching, max_cached_tokens=settings.max_cached_tokens)
        seam = choice.seam(SeamParts(self.processing_class, settings, StoppableGenerator(inner, stop),
                                     self.eos_token_ids))
        return AsyncRollouts(seam, weights, stop, depth=args.max_staleness, cpu=cpu, generator_process=process,
                             present=present, barrier=self.accelerator.wait_for_everyone)

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """TRL's ``train``. The rollout source is stopped however training ends (``on_train_end`` runs only at its
        normal end; not after an exception or Ctrl-C), so that no work ahead and no generator process outlives
        it. What the library logs meanwhile is written above the progress bar, not on its line."""
        try:
            with logging_redirect_tqdm():
                return super().train(*args, **kwargs)
        finally:
            if self.rollout_source is not None:
                self.rollout_source.stop()

    def _check_trl_config(self, args: Any) -> None:
        """Without rollouts the trainer is TRL's: settings that only act on rollouts are refused."""

    def _check_agentic_args(self) -> None:
        if not isinstance(self.args, AgenticConfig):
            raise TypeError(f"environment= needs args={self.config_class.__name__}(...), got {type(self.args).__name__}")
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

    # -- the stages of a round -----------------------------------------------------------------------------------
    def generation_round(self, rows: list[dict[str, Any]], ahead: bool = True) -> Round:
        """Stages 1-4 of a round (module docstring): rollout, rewards, training rows and batch, log-probs. The
        batch's advantages are left at 0 for the sibling's step to set. A round that raises ends training: the rollout
        source is stopped first, so that nothing runs ahead."""
        rollouts = self.rollout(rows, ahead)
        try:
            prompts, completions, run_rewards = self.score(rollouts.rows, rollouts.runs, rollouts.environments)
            round_ = self.build_round(rollouts, run_rewards, prompts, completions)
            self.add_logps(round_.batch, rollouts.behaviour)
            return round_
        except BaseException:
            self.rollout_source.stop()
            raise

    def rollout(self, rows: list[dict[str, Any]], ahead: bool = True) -> Rollouts:
        """1. The round's rollouts, from the rollout source (:mod:`~trl_agentic.rollout.pipeline`): a training
        round's (``ahead``: with ``max_staleness=D``, the rollouts of the rows of D rounds earlier, fewer while the
        pipeline fills, ``rows``' started ahead), or an evaluation's or dynamic sampling's extra round's, rolled out
        now; with them TRL's ``trainer.environments`` (this process's environment instances of the round), and the
        source's metrics logged."""
        rollouts = self.rollout_source.rollouts(rows, self.accelerator.unwrap_model(self.model), self.state.global_step,
                                                ahead and self.model.training)
        self.environments = rollouts.environments
        self.add_metrics(rollouts.metrics)
        return rollouts

    def push_vllm_weights(self, version: int) -> None:
        """vLLM's weights brought up to the policy's (TRL's ``sync_weights``), marked as ``version`` (the global
        step), unless vLLM holds that version already (or there is no vLLM); where nothing of the rollout source
        generates meanwhile (``push_weights``: with rollouts ahead, after every process's jobs ahead ended, between two
        barriers)."""
        if not self.use_vllm or version == self._vllm_weights_step:
            return
        self.rollout_source.push_weights(self.vllm_generation.sync_weights)
        self._vllm_weights_step = version

    def score(self, rows: list[dict[str, Any]], runs: list[Trajectory],
              environments: list[Any] | None) -> tuple[list[Any], list[Any], torch.Tensor]:
        """2. TRL's reward functions on every run, with TRL's keyword arguments and what the rollout adds
        (``trajectory``; ``agent_output`` for agents, ``environments`` for TRL's environments), built by
        :func:`~trl_agentic.rewards.inputs.reward_inputs` as in evaluation. A run whose environment (or agent) failed
        carries no learning signal: it is unscorable (NaN) for every function. Returns the prompts and completions
        the functions received (this process's) and the (R_global, num_reward_funcs) rewards."""
        prompts, completions, extras = reward_inputs(self.rollout_seam, rows, runs, environments,
                                                     self.processing_class)
        reward_rows = [{**row, **extra} for row, extra in zip(rows, extras)]
        completion_ids = [list(t.completion_ids) for t in runs]
        rewards = self.trl_rewards(reward_rows, prompts, completions, completion_ids)
        failed = self.accelerator.gather(torch.tensor([t.env_failed for t in runs], device=rewards.device))
        unscored = torch.isnan(rewards).all(dim=1) & ~failed
        if unscored.any() and self.model.training and self.accelerator.is_main_process:
            logger.warning("step %d: no reward function (%s) scored %d of %d completions: each returned None for "
                           "them, or a value it is warned of above; they train nothing", self.state.global_step + 1,
                           ", ".join(self.reward_func_names), int(unscored.sum()), len(unscored))
        return prompts, completions, rewards.masked_fill(failed.unsqueeze(1), torch.nan)

    def build_round(self, rollouts: Rollouts, run_rewards: torch.Tensor, prompts: list[Any],
                    completions: list[Any]) -> Round:
        """3. The runs' training rows (:meth:`~trl_agentic.Trajectory.training_rows`: one per engine run, one per
        segment of an agent run), with padding rows that make every process's count equal and divisible by
        ``steps_per_generation`` (:func:`~trl_agentic.trainers.round.training_rows`; none when each run is one
        row and the processes have as many runs), and TRL's batch of them (:meth:`build_batch`)."""
        rows, runs = rollouts.rows, rollouts.runs
        multiple = self.args.steps_per_generation if self.model.training else 1
        trajectories, owners = training_rows(runs, self._sync_max, multiple, self.pad_id)
        offset = self.accelerator.process_index * len(runs)
        local_rewards = run_rewards[offset: offset + len(runs)]
        row_rewards = values_of_rows(local_rewards, owners, torch.nan)
        if owners != list(range(len(runs))):  # a segment's own messages; its run's prompt
            prompts = [prompts[o] if o >= 0 else "" for o in owners]
            completions = [list(t.messages) for t in trajectories]
        round_ = Round(rows=rows, runs=runs, run_rewards=run_rewards, trajectories=trajectories, owners=owners,
                       rewards_per_func=self.accelerator.gather(row_rewards.to(self.accelerator.device)),
                       batch=self.build_batch(trajectories, rollouts.behaviour), prompts=prompts,
                       completions=completions)
        if self.args.log_completions:  # trl_agentic/trackers.py: turns, tools, observations in the completions table
            self.log_completion_columns(trajectory_columns(trajectories))
        return round_

    def build_batch(self, trajectories: list[Trajectory], behaviour: bool = False) -> TRLBatch:
        """The training rows as TRL's ``_generate_and_score_completions`` lays out a batch (``grpo_trainer.py``,
        l. 2440-2480; keys in its order): prompts left-padded, completions right-padded (to a multiple of
        ``pad_to_multiple_of``), the env mask as ``tool_mask`` (padded with 1, as TRL's; zero for a failed or, with
        ``mask_truncated_trajectories``, a truncated trajectory), the sampling log-probs (vLLM's, or with
        ``behaviour`` the behaviour policy's), and ``num_items_in_batch = sum_all processes completion_mask *
        tool_mask``. Padding and masks only."""
        device, multiple = self.accelerator.device, self.pad_to_multiple_of
        completion_ids, env_mask, logprobs = trl_completion_rows(
            trajectories, self.pad_id, self.args.mask_observations, self.args.mask_truncated_trajectories)
        prompt_ids = [t.prompt_ids for t in trajectories]
        data: dict[str, Any] = {
            "prompt_ids": pad(prompt_ids, self.pad_id, "left", multiple).to(device),
            "prompt_mask": pad([[1] * len(p) for p in prompt_ids], 0, "left", multiple).to(device),
            "completion_ids": pad(completion_ids, self.pad_id, "right", multiple).to(device),
            "completion_mask": pad([[1] * len(c) for c in completion_ids], 0, "right", multiple).to(device),
            "advantages": torch.zeros(len(trajectories), device=device),
        }
        if self.use_vllm or behaviour:  # vLLM's sampling log-probs, or the behaviour policy's
            # (None where vLLM could not score a token: NaN)
            values = [[float("nan") if x is None else x for x in row] for row in logprobs]
            data["sampling_per_token_logps"] = pad(values, 0.0, "right", multiple, torch.float32).to(device)
        data["tool_mask"] = pad(env_mask, 1, "right", multiple).to(device)
        batch = TRLBatch(data)
        batch.recount_items(self.accelerator.gather)
        return batch

    def add_logps(self, batch: TRLBatch, behaviour: bool = False) -> None:
        """4. The model forwards of a round, as TRL decides them: the policy's log-probs now (``old``) when it moves
        before the batch is trained on (:meth:`policy_moves_before_loss`) or for vLLM's importance-sampling
        correction (then the correction too); the reference's when ``beta != 0``. For ``behaviour`` log-probs (the
        rollouts were sampled by an earlier policy): the proximal policy's and the off-policy correction
        (:meth:`off_policy_correction`), unless the loss computes them from its own forward
        (:attr:`proximal_in_loss`)."""
        args = self.args
        correction = self.use_vllm and args.vllm_importance_sampling_correction and not behaviour
        if behaviour:
            if not self.proximal_in_loss:
                batch.old_logps = self.policy_logps(self.model, batch)  # the proximal policy: the weights of now
                self.off_policy_correction(batch)
        elif self.policy_moves_before_loss() or correction:
            batch.old_logps = self.policy_logps(self.model, batch)
        if correction:
            batch["importance_sampling_ratio"] = vllm_importance_sampling_ratio(
                batch.old_logps, batch.sampling_logps, batch.loss_mask, args.vllm_importance_sampling_mode,
                args.vllm_importance_sampling_clip_min, args.vllm_importance_sampling_clip_max)
        if self.beta != 0.0:
            batch["ref_per_token_logps"] = self.reference_logps(batch)
        batch.in_trl_order()

    def policy_moves_before_loss(self) -> bool:
        """TRL's test (``grpo_trainer.py``, ``_generate_and_score_completions``): an optimizer step falls between a
        round's generation and the loss of some of its micro-batches (``gradient_accumulation_steps`` not a multiple
        of ``steps_per_generation * num_iterations``); otherwise the policy of the loss is the policy of the round."""
        args = self.args
        return args.gradient_accumulation_steps % (args.steps_per_generation * self.num_iterations) != 0

    def needs_old_logps_in_round(self) -> bool:
        """Whether the round itself reads the policy's log-probs of now (PPO's KL reward does); GRPO's does not."""
        return False

    @property
    def proximal_in_loss(self) -> bool:
        """With rollouts sampled by an earlier policy (:attr:`off_policy`): the proximal policy's log-probs are the
        loss's own, detached, and the off-policy correction is computed in the loss
        (:meth:`proximal_in_micro_batch`), saving a forward pass of every round. Exact when the policy does not move
        between a round and its loss (:meth:`policy_moves_before_loss` false: one optimizer step per round, TRL's
        default) and the round does not read them (:meth:`needs_old_logps_in_round`)."""
        return self.off_policy and not self.policy_moves_before_loss() and not self.needs_old_logps_in_round()

    def off_policy_correction(self, batch: TRLBatch) -> None:
        """The correction for samples drawn by an earlier policy (the behaviour policy ``mu``,
        whose log-probs the generator returned: ``batch.sampling_logps``), on agent tokens only, from the proximal
        policy's log-probs ``batch.old_logps`` (``pi_prox``, the policy before this round's update):
        :func:`~trl_agentic.algorithms.importance.off_policy_terms` for ``async_correction``. With
        ``rho_t = pi / pi_old`` the loss is ``L = -min(rho A, clip(rho, 1-eps_low, 1+eps_high) A) * w``.

        The weight ``w`` goes where vLLM's correction goes (``importance_sampling_ratio``), so that its metrics
        (``sampling/importance_sampling_ratio/*``, ``agentic/vllm_logprob_gap``) are logged as for vLLM."""
        args = self.args
        old, weight = off_policy_terms(batch.old_logps, batch.sampling_logps, batch.loss_mask, args.async_correction,
                                       args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_min,
                                       args.vllm_importance_sampling_clip_max)
        batch.old_logps = old
        if weight is not None:
            batch["importance_sampling_ratio"] = weight

    def proximal_in_micro_batch(self, batch: TRLBatch, logps: torch.Tensor) -> TRLBatch:
        """:attr:`proximal_in_loss`: ``batch`` (a micro-batch) with the proximal log-probs ``logps`` (the loss's
        own, detached) and the off-policy correction from them (:meth:`off_policy_correction`); the sampling
        metrics are computed here instead of in the round, with the loss-side metrics of the optimizer step
        (:attr:`loss_metrics`)."""
        batch = TRLBatch({**batch.data, "old_per_token_logps": logps.detach()})
        self.off_policy_correction(batch)
        if batch.sampling_logps is not None:
            add_sampling_values(self.loss_metrics, sampling_values(batch))
        return batch

    def record(self, round_: Round) -> None:
        """Append the round's training rows, with their run's rewards and their advantage (the batch's, one per row:
        :func:`~trl_agentic.trainers.round.row_advantages`; with per-token advantages, PPO's or GiGPO's, also each
        turn's: :func:`~trl_agentic.trainers.round.turn_advantages`), to ``trajectory_dir``."""
        directory = getattr(self.args, "trajectory_dir", None)
        if not directory or not round_.trajectories:
            return
        advantages = row_advantages(round_.batch)
        rewards = self._local(round_.rewards_per_func).cpu()
        total = self._local(self.combined_rewards(round_.rewards_per_func)).cpu()
        names = list(self.reward_func_names)
        path = os.path.join(directory, f"trajectories-rank{self.accelerator.process_index}.jsonl")
        extra = {
            "step": self.state.global_step,
            "reward": [None if torch.isnan(r) else float(r) for r in total],
            "rewards": [{n: (None if torch.isnan(v) else float(v)) for n, v in zip(names, r)} for r in rewards],
            "advantage": [float(a) for a in advantages.cpu()],
        }
        per_turn = turn_advantages(round_.batch, round_.trajectories)
        if per_turn is not None:
            extra["turn_advantages"] = per_turn
        save_trajectories(round_.trajectories, path, extra=extra)

    # -- metrics ------------------------------------------------------------------------------------------------
    def round_metrics(self, round_: Round, algorithm: dict[str, torch.Tensor] | None = None
                      ) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        """A round over every process, from this process's values
        (:func:`~trl_agentic.trainers.metrics.round_values`) gathered in one call (:meth:`gather_round_values`)
        and summarized (:func:`~trl_agentic.trainers.metrics.summarize`, kept as ``round_.summary``): returns
        its metrics that do not depend on the algorithm (the rollout's, TRL's lengths, the mask audit, vLLM's
        sampling gaps) and the ``algorithm``'s sums over every process. TRL's completions table, with the reward
        functions' ``log_extra`` columns and ``log_metric`` metrics, is logged (:meth:`log_round_table`) and the
        round's tokens are added to TRL's ``num_tokens``."""
        table = RoundTable(round_.prompts, round_.completions, row_advantages(round_.batch).tolist(),
                           *self.take_round_logs())
        local = round_values(round_, self.rollout_seam, self.args.mask_observations, table, algorithm or {})
        round_.summary = summarize(self.gather_round_values(local), self.rollout_seam, self.accelerator.device)
        self.count_tokens(round_.summary.tokens)
        self.log_round_table(*round_.summary.table, round_.rewards_per_func)
        return round_.summary.metrics, round_.summary.algorithm

    def log_round_metrics(self, round_: Round, metrics: dict[str, float]) -> None:
        """Log a round's metrics (TRL averages and logs them with its own) and, in training, read the round with
        them (:meth:`~trl_agentic.trainers.run_health.RunHealth.observe`): its failed trajectories in one line and
        the run's health warnings, printed by the main process, and the stop of a run that trains on nothing
        (``max_degenerate_steps`` rounds in a row with no scorable completion, or a round of agents whose every
        request the endpoint refused; the round's trajectories are recorded before)."""
        self.add_metrics(metrics)
        if not self.model.training:
            return
        summary = round_.summary
        unscorable = bool(torch.isnan(round_.run_rewards).all())
        lines, stop = self.health.observe(f"step {self.state.global_step + 1}", summary.sums, summary.failures,
                                          summary.refusal, unscorable, metrics)
        if self.accelerator.is_main_process:
            for line in lines:
                logger.warning(line)
        if stop is not None:
            raise DegenerateTrainingError(stop)

    def gather_round_values(self, local: RoundValues) -> list[RoundValues]:
        """The one collective call of a round's metrics: every process's values, in rank order. Every rank calls it
        once per round (from :meth:`round_metrics`), whatever its rollout kind or settings."""
        return gather_object([local])

    def reward_metrics(self, rewards_per_func: torch.Tensor) -> dict[str, float]:
        """TRL's per-round reward metrics (``grpo_trainer.py`` l. 2820-2830) over the training rows of every
        process: ``rewards/<name>/mean`` and ``/std`` over the rows each function scored, ``reward`` and
        ``reward_std`` of the weighted sum over scorable rows."""
        metrics = {}
        for i, name in enumerate(self.reward_func_names):
            metrics[f"rewards/{name}/mean"] = torch.nanmean(rewards_per_func[:, i]).item()
            metrics[f"rewards/{name}/std"] = nanstd(rewards_per_func[:, i]).item()
        rewards = self.combined_rewards(rewards_per_func)
        metrics["reward"] = torch.nanmean(rewards).item()
        metrics["reward_std"] = nanstd(rewards).item()
        return metrics

    # -- helpers ------------------------------------------------------------------------------------------------
    def combined_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """The weighted sum of the reward functions per row (NaN-skipping; NaN where no function scored):
        :func:`~trl_agentic.algorithms.advantages.combined_rewards`."""
        return combined_rewards(rewards_per_func, self.reward_weights, 1)

    def _generator(self, settings: RolloutConfig) -> Generator:
        if self.use_vllm:
            return TRLVLLMGenerator(self)
        return HFGenerator(self.model, self.processing_class, self.generation_config,
                           unwrap=lambda: unwrap_for_generation(self), keep_cache=settings.prefix_caching,
                           max_cached_tokens=settings.max_cached_tokens,
                           return_logprobs=bool(self.args.max_staleness))  # every round's batch has them then

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

    def _local(self, global_values: torch.Tensor) -> torch.Tensor:
        """This process's slice of a tensor over the global batch."""
        local = len(global_values) // self.accelerator.num_processes
        start = self.accelerator.process_index * local
        return global_values[start : start + local]

    # -- the clipped policy loss (GRPO with k1/k2, PPO) -----------------------------------------------------------
    def clipped_loss(self, model: Any, batch: TRLBatch, kl_estimator: str | None = None) -> torch.Tensor:
        """The clipped policy loss with an optional KL term, as TRL 1.16's ``_compute_loss`` computes it for the
        clipped loss types (``grpo``, ``bnpo``, ``dr_grpo``, ``dapo``, ``luspo``), with any KL estimator. With
        importance ratio ``rho_t = pi(y_t)/pi_old(y_t)`` (per token, or ``exp(mean_t log rho_t)`` per sequence for
        ``importance_sampling_level="sequence"``, GSPO), advantage ``A`` (per sequence, GRPO's, or per token, PPO's)
        and trained tokens ``m_t`` (sampled tokens only, observations excluded):

            L = agg_t m_t [ -min(rho_t A, clip(rho_t, 1-eps_low, 1+eps_high) A) * w_t + beta * KL_t * (rho_t) ]

        ``w_t`` is vLLM's importance-sampling correction when TRL applies it; the factor ``rho_t`` on the KL term
        only with ``use_bias_correction_kl``; ``KL_t = kl_penalty(logp, logp_ref, kl_estimator)`` (Schulman 2020)
        with ``r = logp_ref - logp``; ``agg`` per ``loss_type`` (:func:`~trl_agentic.algorithms.losses.aggregate_loss`).
        With ``kl_estimator="k3"`` this equals TRL's loss (a contract test checks every clipped loss type). Masked
        positions read the policy's own log-probs (ratio 1, KL 0), so a non-finite value there never reaches the
        loss or its gradient.
        """
        mask = batch.loss_mask.bool()
        logps, entropies = self.logps_and_entropies(model, batch)
        if self.proximal_in_loss:
            batch = self.proximal_in_micro_batch(batch, logps)
        ratio = importance_ratio(logps, batch.old_logps, batch.loss_mask, self.importance_sampling_level)
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
        for name, value in logged.items():  # means over the trained tokens of the step, on every process
            self.loss_metrics.mean(name, masked_sum(value.detach().expand_as(mask), mask), mask.sum())
        return self.aggregate_like_trl(per_token, mask, batch)

    def aggregate_like_trl(self, per_token: torch.Tensor, mask: torch.Tensor, batch: TRLBatch) -> torch.Tensor:
        """Reduce a (B, T) per-token term as TRL 1.16's ``_compute_loss`` reduces its per-token loss for the
        configured ``loss_type`` (:func:`~trl_agentic.algorithms.losses.aggregate_loss`), so that a term added here
        equals the same term added inside TRL's loss (checked against TRL's own k3 term for every loss type)."""
        training = self.model.training
        return aggregate_loss(
            per_token, mask, self.loss_type,
            accumulation=self.current_gradient_accumulation_steps if training else 1.0,
            max_completion_length=self.max_completion_length, num_items=batch.num_items_in_batch,
            num_processes=self.accelerator.num_processes, steps_per_generation=self.args.steps_per_generation,
            training=training)

    def after_loss(self) -> None:
        """After each micro-batch's loss: once the optimizer step's last micro-batch has run (``sync_gradients``;
        in evaluation, every call), the loss-side metrics of every process, gathered in one call
        (:meth:`~trl_agentic.trainers.metrics.LossMetrics.flush`), logged."""
        if not self.model.training or self.accelerator.sync_gradients:
            self.add_metrics(self.loss_metrics.flush(self.accelerator.gather, self.accelerator.device))

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
        if getattr(self.args, "max_staleness", 0):
            return "max_staleness >= 1 (its loss is clipped_loss)"
        return f"kl_estimator={getattr(self.args, 'kl_estimator', 'k3')!r}"
