"""``AgenticPPOTrainer``: PPO with a learned critic for multi-turn agents, on TRL's GRPOTrainer machinery.

TRL removed its PPOTrainer in 1.13. This one reuses everything ``AgenticGRPOTrainer`` has (rollouts, environments,
HF generate / vLLM, PEFT, accelerate) and changes three things:

1. **Advantages** (:meth:`AgenticPPOTrainer.training_batch`, on the round of
   :meth:`~trl_agentic.AgenticGRPOTrainer.generation_round`): GAE over agent tokens (Schulman et al. 2016) with
   values from the critic, on the per-token reward "outcome score on the last agent token minus ``beta * KL`` on
   every agent token" (Ziegler et al. 2019; Ouyang et al. 2022), with the chosen estimator (k1 by default, as
   Search-R1's PPO). ``advantage_mode="turn"`` runs GAE with one step per turn instead (environment turn rewards
   included) and broadcasts each turn's advantage to its tokens. Advantages are whitened over the agent tokens of
   the whole batch (all processes).
2. **Loss** (:meth:`AgenticPPOTrainer.loss`): the clipped policy loss on the per-token advantages, aggregated as
   TRL aggregates (no KL term: the KL lives in the reward), plus ``vf_coef`` times the clipped value loss over
   agent tokens.
3. **One sample per prompt** is allowed (``num_generations=1``): no group baseline is needed.

Observation tokens carry no reward, no value target and no TD step, and get no policy or value gradient.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import broadcast
from peft import PeftModel

from ..algorithms.gae import build_token_rewards, build_turn_rewards, token_gae, turn_gae
from ..algorithms.kl import KL_ESTIMATORS, AdaptiveKLController, kl_penalty
from ..algorithms.losses import clipped_value_loss
from ..algorithms.masked import masked_whiten, zero_masked
from ..algorithms.turns import broadcast_turns, gather_turn_values, turn_ids_from_spans, turn_mask
from ..compat import TRLBatch, post_init_with_one_generation
from ..renamed import renamed_arguments
from .base import AgenticTrainer
from .config import AgenticConfig
from .critic import CriticGradients, SharedValueHead, ValueModel
from .round import Round


@renamed_arguments({
    "kl_coef": "the KL coefficient is beta (GRPOConfig's name): pass beta=",
    "cliprange": "the clip range is epsilon (and epsilon_high for the upper one): pass epsilon=",
    "num_ppo_epochs": "the PPO epochs are num_iterations: pass num_iterations=",
    "missing_eos_penalty": "the penalty of an unfinished trajectory is truncation_penalty: pass truncation_penalty=",
})
@dataclass
class AgenticPPOConfig(AgenticConfig):
    """``GRPOConfig`` plus multi-turn rollout settings (:class:`~trl_agentic.trainers.config.AgenticConfig`) and PPO's
    own.

    Batches: each generation round rolls out ``per_device_train_batch_size * gradient_accumulation_steps *
    num_mini_batches`` prompts per process (one completion each, ``num_generations=1``); each of
    ``num_iterations`` passes (PPO epochs) over them draws a new permutation and takes ``num_mini_batches``
    optimizer steps, each on ``gradient_accumulation_steps`` micro-batches of ``per_device_train_batch_size``.

    Names: the KL coefficient is GRPOConfig's ``beta`` (TRL's former ``PPOConfig.kl_coef``), the clip range
    ``epsilon`` (``cliprange``; ``epsilon_high``, if set, the upper one), the PPO epochs ``num_iterations``
    (``num_ppo_epochs``), the penalty of an unfinished trajectory ``truncation_penalty`` (``missing_eos_penalty``).
    ``vf_coef``, ``cliprange_value``, ``gamma``, ``lam``, ``whiten_rewards`` and ``num_mini_batches`` keep the
    former ``PPOConfig`` names. GRPO's group-advantage settings (``scale_rewards``, ``zero_variance_groups``,
    ``std_floor``, ``max_extra_generation_rounds``) do not apply and are not arguments.
    """

    num_generations: int = field(default=1, metadata={"help": "Samples per prompt; PPO needs no group."})
    beta: float = field(default=0.001, metadata={"help": "Weight of the per-token KL penalty in the reward."})
    kl_estimator: str = field(default="k1", metadata={"help": "KL estimator in the reward: k1, k2 or k3."})
    num_mini_batches: int = field(default=1, metadata={"help": "Optimizer steps per pass over a generation batch."})
    target_kl: float | None = field(default=None, metadata={"help": "Adaptive KL: target per-sequence KL."})
    kl_horizon: float = field(default=10000.0, metadata={"help": "Adaptive KL horizon (in samples)."})
    vf_coef: float = field(default=0.1, metadata={"help": "Weight of the value loss."})
    cliprange_value: float = field(default=0.2, metadata={"help": "Value clip range around the old values."})
    gamma: float = field(default=1.0, metadata={"help": "Discount per step (token or turn)."})
    lam: float = field(
        default=0.95,
        metadata={"help": "GAE lambda (TRL's former PPOConfig default). With an outcome score and gamma 1, the score "
                  "reaches a token scaled by lam per later agent token; 1.0 (Search-R1's, verl's default) gives "
                  "every agent token score - V."},
    )
    whiten_rewards: bool = field(
        default=False,
        metadata={"help": "Whiten the per-token rewards (no mean shift); advantage_mode='token' only."},
    )
    truncation_penalty: float | None = field(
        default=None,
        metadata={"help": "Subtracted from the score of trajectories that did not end on their own (budget, "
                  "environment truncation)."},
    )
    advantage_mode: str = field(default="token", metadata={"help": "'token' (GAE per token) or 'turn' (per turn)."})
    critic: str = field(
        default="separate",
        metadata={"help": "'separate': a value model initialised from the policy; 'shared': a value head over the "
                  "policy's decoder (with peft_config: its own LoRA adapter)."},
    )
    critic_learning_rate: float | None = field(
        default=None, metadata={"help": "Learning rate of the critic's param group (default: learning_rate)."}
    )
    critic_warmup_steps: int = field(
        default=0,
        metadata={"help": "Value-only optimizer steps at the start (verl's critic_warmup): the loss is the value "
                  "loss alone, so the policy's own weights do not move while a fresh critic fits the returns."},
    )
    critic_detach_backbone: bool = field(
        default=False,
        metadata={"help": "critic='shared' without PEFT only: False (default, the shared trunk of TRL's former "
                  "AutoModelForCausalLMWithValueHead and cleanrl's PPO) lets vf_coef * value loss train the "
                  "policy's decoder too, at the policy's learning rate; True trains the value head alone."},
    )
    # TRL's group-advantage setting: PPO has no groups; fixed, and hidden from --help (HfArgumentParser skips
    # init=False fields).
    scale_rewards: str = field(default="group", init=False)

    def __post_init__(self) -> None:
        if self.generation_batch_size is not None or self.steps_per_generation is not None:
            raise ValueError("AgenticPPOConfig sets the generation batch from num_mini_batches; do not pass "
                             "generation_batch_size or steps_per_generation")
        if self.num_mini_batches < 1:
            raise ValueError(f"num_mini_batches must be >= 1, got {self.num_mini_batches}")
        self.steps_per_generation = self.num_mini_batches * self.gradient_accumulation_steps
        post_init_with_one_generation(self, super().__post_init__)
        if self.advantage_mode not in ("token", "turn"):
            raise ValueError(f"advantage_mode must be 'token' or 'turn', got {self.advantage_mode!r}")
        if self.critic not in ("separate", "shared"):
            raise ValueError(f"critic must be 'separate' or 'shared', got {self.critic!r}")
        if self.whiten_rewards and self.advantage_mode != "token":
            raise ValueError("whiten_rewards=True whitens per-token rewards; it needs advantage_mode='token'")
        if self.critic_detach_backbone and self.critic != "shared":
            raise ValueError("critic_detach_backbone=True applies to critic='shared' only (a separate critic shares "
                             "no backbone); drop it")
        if self.critic_warmup_steps < 0:
            raise ValueError(f"critic_warmup_steps must be >= 0, got {self.critic_warmup_steps}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")


class AgenticPPOTrainer(AgenticTrainer):
    """PPO with a critic for multi-turn agents; see the module docstring.

    Example::

        trainer = AgenticPPOTrainer(
            model="Qwen/Qwen2.5-0.5B-Instruct", reward_funcs=QAReward(),
            args=AgenticPPOConfig(output_dir="out", critic="shared", critic_learning_rate=1e-5, learning_rate=1e-6),
            train_dataset=dataset, environment=partial(TagEnvironment, tools={"search": search}),
            peft_config=LoraConfig(r=16, target_modules="all-linear", task_type="CAUSAL_LM"),
        )
        trainer.train()

    Args:
        value_model: Optional critic: a :class:`~trl_agentic.trainers.critic.ValueModel`, or a checkpoint path to initialise
            one from (e.g. the policy's). By default ``args.critic`` decides: a copy of the policy
            (``"separate"``) or a head over the policy's decoder (``"shared"``).
        *args, **kwargs: As :class:`AgenticGRPOTrainer` (``environment=``, ``peft_config=``, ...).
    """

    config_class: type = AgenticPPOConfig  # the default config when args=None with tools=/environment_factory=
    reshuffle_each_pass = True  # a new mini-batch permutation for every PPO epoch (cleanrl, TRL's former PPO)

    def __init__(self, *args: Any, value_model: ValueModel | str | None = None, **kwargs: Any) -> None:
        # PEFT resolves target_modules="all-linear" in place into the policy's module paths, which the critic lacks
        peft_config = copy.deepcopy(kwargs.get("peft_config"))
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, AgenticPPOConfig):
            raise TypeError(f"AgenticPPOTrainer needs args=AgenticPPOConfig(...), got {type(self.args).__name__}")
        if self.rollout_seam is None:
            raise ValueError("AgenticPPOTrainer trains on rollouts: pass environment= (or TRL's tools=, or agent=)")
        self._check_clipped_loss_settings()
        self.critic = self._build_critic(value_model, peft_config)
        self.critic_gradients = CriticGradients(self.extra_parameters)
        self.add_callback(self.critic_gradients)
        # The coefficient of the KL in the reward: args.beta, adapted by the controller (its only writer) when
        # target_kl is set. TRL's own self.beta stays args.beta (TRL computes the reference log-probs when it is != 0).
        self.kl_coef = self.args.beta
        self.kl_controller = (
            AdaptiveKLController(self.args.beta, self.args.target_kl, self.args.kl_horizon)
            if self.args.target_kl is not None else None
        )

    # -- critic ----------------------------------------------------------------------------------------------
    def _build_critic(self, value_model: ValueModel | str | None, peft_config: Any) -> torch.nn.Module:
        policy = self.accelerator.unwrap_model(self.model)
        if isinstance(value_model, ValueModel):
            critic = value_model
        elif value_model is not None:
            critic = ValueModel.from_policy(value_model)
        elif self.args.critic == "shared":
            critic_adapter = None
            if isinstance(policy, PeftModel) and self.args.critic_detach_backbone:
                raise ValueError("critic_detach_backbone=True applies to a policy without PEFT; with peft_config the "
                                 "shared critic has its own adapter and never trains the policy's: drop it")
            if isinstance(policy, PeftModel) and peft_config is not None:
                critic_adapter = type(peft_config)(**{**peft_config.to_dict(), "task_type": None})
            critic = SharedValueHead(policy, adapter_config=critic_adapter,
                                     detach_backbone=self.args.critic_detach_backbone)
        else:
            critic_lora = None
            if peft_config is not None:
                critic_lora = type(peft_config)(**{**peft_config.to_dict(), "task_type": "FEATURE_EXTRACTION"})
            critic = ValueModel.from_policy(policy, peft_config=critic_lora)
        critic = critic.to(self.accelerator.device)
        if self.accelerator.num_processes > 1:  # the fresh head is random per process: start from rank 0's
            with torch.no_grad():
                for parameter in critic.parameters():
                    parameter.copy_(broadcast(parameter.detach().clone(), from_process=0))
        return critic

    def _critic_parameters(self) -> list[torch.nn.Parameter]:
        if isinstance(self.critic, SharedValueHead):
            return self.critic.critic_parameters()
        return [p for p in self.critic.parameters() if p.requires_grad]

    def extra_parameters(self) -> list[torch.nn.Parameter]:
        """The critic's parameters outside the policy model (the whole separate critic, or the shared head):
        averaged over processes and cleared after each step (:class:`~trl_agentic.trainers.critic.CriticGradients`), clipped
        with the policy's (the boundary)."""
        inside = {id(p) for p in self.model.parameters()}
        return [p for p in self._critic_parameters() if id(p) not in inside]

    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
        """TRL's step; on the last micro-batch of an optimizer step the critic's gradients outside the policy
        model (which DDP does not wrap) are averaged over processes, before the Trainer clips them."""
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self.accelerator.sync_gradients:
            self.critic_gradients.average_over_processes(self.accelerator)
        return loss

    def create_optimizer(self, model: Any = None) -> torch.optim.Optimizer:
        """The policy's param groups without the critic's parameters, plus one group for all of them with
        ``critic_learning_rate`` (Search-R1: actor 1e-6, critic 1e-5) and no weight decay. One optimizer step updates
        both. (A shared critic's adapter lives inside the policy model, so the Trainer's groups would hold it.)"""
        if self.optimizer is not None:  # built already, critic group included
            return self.optimizer
        optimizer = super().create_optimizer(model)
        critic = self._critic_parameters()
        critic_ids = {id(p) for p in critic}
        for group in optimizer.param_groups:
            group["params"] = [p for p in group["params"] if id(p) not in critic_ids]
        lr = self.args.critic_learning_rate or self.args.learning_rate
        optimizer.add_param_group({"params": critic, "lr": lr, "weight_decay": 0.0})
        return optimizer

    def _critic_values(self, batch: TRLBatch) -> torch.Tensor:
        return self.critic(batch.input_ids(), batch.attention_mask(), completion_length=batch.completion_ids.size(1))

    # -- one generation round -------------------------------------------------------------------------------------
    def training_batch(self, rows: list[dict[str, Any]]) -> TRLBatch:
        """The batch of one generation round, read top to bottom (module docstring):

        1-4. :meth:`~trl_agentic.trainers.base.AgenticTrainer.generation_round`: the runs, their rewards, the
             training rows and TRL's batch of them, the log-probs the step needs;
        5. the outcome score of each row (its run's weighted reward; minus ``truncation_penalty`` for a run that did
           not end on its own); a row no reward function could score (its environment failed, say) leaves the loss;
        6. the KL of each agent token to the reference, ``KL_t = k(log pi_old, log pi_ref)`` with the chosen
           estimator, and the critic's values ``V`` (no gradient);
        7. GAE over agent tokens on ``r_t = -beta * KL_t`` plus the score on the last agent token (or one step per
           turn, ``advantage_mode="turn"``, with the environment's turn rewards): ``A, R = GAE(r, V; gamma, lam)``,
           ``A`` whitened over the agent tokens of all processes;
        8. the adaptive KL coefficient's update (``target_kl``);
        9. TRL's completions table; the trajectories to ``trajectory_dir``; the metrics, logged once, with what the
           run's health says of the round (which may stop the run).

        The sampling-time log-probs cost a forward pass over the batch. TRL computes them when the policy moves
        before the batch is trained on (``num_iterations > 1`` or several mini-batches); otherwise they equal the
        loss's own log-probs (the ratio is 1 at the first step), and they are computed here only for the KL reward
        (``beta != 0``).
        """
        round_ = self.generation_round(rows)
        batch = round_.batch
        scores = self.scores(round_)
        mask = batch.loss_mask.bool()
        kl = self.reference_kl(batch)
        with torch.no_grad():
            values = zero_masked(self._critic_values(batch).float(), mask)
        agent_tokens = mask.float()
        if self.args.advantage_mode == "token":
            rewards = build_token_rewards(scores, agent_tokens, kl, self.kl_coef)
            if self.args.whiten_rewards:
                rewards = masked_whiten(rewards, agent_tokens, shift_mean=False, reduce=self._reduce)
            advantages, returns = token_gae(rewards, values, agent_tokens, self.args.gamma, self.args.lam)
        else:
            advantages, returns = self._turn_advantages(round_, scores, values, agent_tokens, kl)
        batch.advantages = masked_whiten(advantages, agent_tokens, reduce=self._reduce)
        batch["values"], batch["returns"] = values, returns
        metrics, sums = self.round_metrics(round_, ppo_sums(scores, values, returns, agent_tokens, kl))
        metrics.update(self.reward_metrics(round_.rewards_per_func))
        metrics.update(ppo_metrics(sums))
        if kl is not None:
            metrics["ppo/kl_coef"] = self.kl_coef
            if self.kl_controller is not None and self.model.training:
                self.kl_coef = self.kl_controller.update(metrics["ppo/kl_per_sequence"],
                                                         self.args.generation_batch_size)
        self.record(round_)
        self.log_round_metrics(round_, metrics)
        return batch

    def scores(self, round_: Round) -> torch.Tensor:
        """5. Each training row's outcome score: its run's weighted reward, minus ``truncation_penalty`` when the run
        did not end on its own. A row no function could score trains no token (its mask is zeroed, and
        ``num_items_in_batch`` recounted); its score is 0."""
        batch = round_.batch
        combined = self._local(self.combined_rewards(round_.rewards_per_func)).to(batch.completion_ids.device)
        unscorable = torch.isnan(combined)
        if unscorable.any():
            batch.env_mask = batch.env_mask * (~unscorable).unsqueeze(1).to(batch.env_mask.dtype)
            batch.recount_items(self.accelerator.gather)
        scores = torch.nan_to_num(combined, nan=0.0)
        if self.args.truncation_penalty is not None:
            unfinished = torch.tensor([t.truncated for t in round_.trajectories], device=scores.device)
            scores = scores - self.args.truncation_penalty * unfinished.float()
        return scores

    def needs_old_logps_in_round(self) -> bool:
        """The KL reward (``beta != 0``) reads the policy's log-probs at sampling time in the round."""
        return self.beta != 0.0

    def reference_kl(self, batch: TRLBatch) -> torch.Tensor | None:
        """6. ``KL_t`` of every agent token, from the log-probs at sampling time (``old``) and the reference's, with
        ``kl_estimator``; ``None`` when ``beta == 0``. The reference log-probs leave the batch: the KL is in the
        reward, TRL's loss must not see them."""
        ref_logps = batch.pop_ref_logps()
        if ref_logps is None:
            return None
        if batch.old_logps is None:  # an on-policy round (TRL skips them): the KL reward needs them now
            batch.old_logps = self.policy_logps(self.model, batch)
        return zero_masked(kl_penalty(batch.old_logps, ref_logps, self.args.kl_estimator), batch.loss_mask.bool())

    def _turn_advantages(self, round_: Round, scores, values, mask, kl):
        spans = [t.turn_spans for t in round_.trajectories]
        ids = turn_ids_from_spans(spans, mask)
        num_turns = max(1, max(len(s) for s in spans))
        env_rewards = torch.zeros(len(spans), num_turns, device=values.device)
        for row, t in enumerate(round_.trajectories):
            env_rewards[row, : len(t.turn_rewards)] = torch.tensor(t.turn_rewards[:num_turns], dtype=torch.float)
        turn_rewards = build_turn_rewards(scores, ids, num_turns, env_rewards, kl, self.kl_coef)
        turn_values = gather_turn_values(values, ids, num_turns)
        turn_adv, turn_ret = turn_gae(turn_rewards, turn_values, turn_mask(ids, num_turns), self.args.gamma, self.args.lam)
        return broadcast_turns(turn_adv, ids), broadcast_turns(turn_ret, ids)

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        return self.accelerator.reduce(x, reduction="sum") if self.accelerator.num_processes > 1 else x

    # -- loss (hook of the boundary) -------------------------------------------------------------------------
    def loss(self, model: Any, batch: TRLBatch) -> torch.Tensor:
        """PPO's loss, with ratio ``rho_t = pi(y_t)/pi_old(y_t)``, whitened GAE advantage ``A_t``, trained tokens
        ``m_t`` (sampled tokens only), old values ``V_old`` and returns ``R`` from :meth:`training_batch`:

            L_policy = agg_t m_t * -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)    (clipped_loss)
            L_value  = 0.5 * mean_{t: m_t} max((V_t - R_t)^2, (V_old_t + clip(V_t - V_old_t, -c, c) - R_t)^2)
            L        = L_policy + vf_coef * L_value / gradient_accumulation_steps

        (``agg`` per ``loss_type``; ``c = cliprange_value``). The KL is not in the loss: it is in the reward.
        During the first ``critic_warmup_steps`` optimizer steps ``L = vf_coef * L_value / gradient_accumulation_steps``
        (the policy term is not computed; with a shared trunk and no critic adapter the value loss still moves it).
        """
        warming_up = self.model.training and self.state.global_step < self.args.critic_warmup_steps
        policy_loss = 0.0 if warming_up else self.clipped_loss(model, batch)
        mask = batch.loss_mask.float()
        values = self._critic_values(batch).float()
        value_loss, clip_fraction = clipped_value_loss(
            values, batch["values"], batch["returns"], mask, self.args.cliprange_value
        )
        accumulation = self.current_gradient_accumulation_steps if self.model.training else 1
        self.loss_metrics.mean("ppo/value_loss", value_loss.detach(), 1)  # averaged over micro-batches and processes
        self.loss_metrics.mean("ppo/value_clipfrac", clip_fraction.detach(), 1)
        return policy_loss + self.args.vf_coef * value_loss / accumulation

    def _clipped_loss_user(self) -> str:
        return "AgenticPPOTrainer"

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        super().save_model(output_dir, _internal_call)
        if self.accelerator.is_main_process:
            self.critic.save_pretrained(os.path.join(output_dir or self.args.output_dir, "critic"))


def ppo_sums(scores: torch.Tensor, values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
             kl: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """This process's sums behind PPO's round metrics (summed over processes with the round's values,
    :meth:`~trl_agentic.trainers.base.AgenticTrainer.round_metrics`), in float64: the rows' scores; over agent tokens
    (``mask``) the values ``V``, the returns ``R`` and ``R - V`` with their squares; with a KL, its per-sequence sum
    over the rows the loss trains on."""
    m = mask.double()
    v, r = values.detach().double() * m, returns.detach().double() * m
    residual = r - v
    sums = {"score": torch.stack([scores.detach().double().sum(), torch.tensor(float(scores.numel()),
                                                                                dtype=torch.float64)]),
            "tokens": torch.stack([v.sum(), r.sum(), (r * r).sum(), residual.sum(), (residual * residual).sum(),
                                   m.sum()])}
    if kl is not None:
        trained = mask.any(-1)
        sums["kl"] = torch.stack([(kl.detach().double().sum(-1) * trained).sum(), trained.sum().double()])
    return sums


def ppo_metrics(sums: dict[str, torch.Tensor]) -> dict[str, float]:
    """``ppo/score_mean``, ``ppo/value_mean``, ``ppo/explained_variance`` (``1 - Var(R - V) / Var(R)`` over agent
    tokens, ``Var(x) = E[x^2] - E[x]^2``; NaN when the returns have no variance, as OpenAI baselines') and, with a KL,
    ``ppo/kl_per_sequence`` (over the rows the loss trains on: a row left out has no KL to speak of, not KL 0), from
    the sums of every process (:func:`ppo_sums`)."""
    score_total, rows = sums["score"].tolist()
    value, ret, ret_sq, residual, residual_sq, tokens = sums["tokens"].tolist()
    n = max(tokens, 1.0)
    var_returns = ret_sq / n - (ret / n) ** 2
    var_residual = residual_sq / n - (residual / n) ** 2
    metrics = {"ppo/score_mean": score_total / max(rows, 1.0), "ppo/value_mean": value / n,
               "ppo/explained_variance": 1 - var_residual / var_returns if var_returns > 1e-12 else float("nan")}
    if "kl" in sums:
        kl_total, trained = sums["kl"].tolist()
        metrics["ppo/kl_per_sequence"] = kl_total / max(trained, 1.0)
    return metrics
