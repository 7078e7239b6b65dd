"""AgenticPPOTrainer: critic options, GAE modes, masking of policy and value gradients, a short learning run."""

import pytest
import torch
from helpers import EchoEnvironment, lookup_dataset, ppo_args
from peft import LoraConfig

from trl_agentic import AgenticPPOTrainer
from trl_agentic.toy import LookupEnvironment, lookup_reward
from trl_agentic.trainers.critic import SharedValueHead, ValueModel


def agent_tokens_reward(completions, trajectory, **kwargs):
    return [t.num_agent_tokens / 10 for t in trajectory]


def _trainer(tiny_model_dir, tokenizer, tmp_path, environment=LookupEnvironment, peft_config=None, **overrides):
    return AgenticPPOTrainer(model=tiny_model_dir, reward_funcs=[lookup_reward, agent_tokens_reward],
                             args=ppo_args(tmp_path, **overrides), train_dataset=lookup_dataset(8),
                             processing_class=tokenizer, environment=environment, peft_config=peft_config)


@pytest.mark.parametrize(
    "critic,use_lora,mode",
    [("separate", False, "token"), ("separate", True, "turn"), ("shared", True, "token"), ("shared", False, "turn")],
)
def test_ppo_training_steps(tiny_model_dir, tokenizer, tmp_path, critic, use_lora, mode):
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM") if use_lora else None
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, environment=lambda: EchoEnvironment(turns=2),
                       peft_config=lora, critic=critic, advantage_mode=mode, critic_learning_rate=1e-2,
                       num_iterations=2, num_mini_batches=2, per_device_train_batch_size=2)
    expected_type = SharedValueHead if critic == "shared" else ValueModel
    assert isinstance(trainer.critic, expected_type)
    head_before = trainer.critic.head.weight.detach().clone()
    trainer.train()
    assert not torch.equal(head_before, trainer.critic.head.weight.detach())
    groups = trainer.optimizer.param_groups
    assert groups[-1]["lr"] <= 1e-2 and any(p is trainer.critic.head.weight for p in groups[-1]["params"])
    logs = [r for r in trainer.state.log_history if "loss" in r]
    assert len(logs) == 2
    # 2 mini-batches x 2 epochs: one generation feeds 4 optimizer steps, so only the first row has rollout metrics
    assert logs[0]["agentic/mask_audit"] == 0
    for key in ("ppo/explained_variance", "ppo/kl_per_sequence", "ppo/score_mean"):
        assert key in logs[0]
    assert all("ppo/value_loss" in row for row in logs)


def test_ppo_zero_policy_and_value_gradient_at_observations(tiny_model_dir, tokenizer, tmp_path):
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, environment=lambda: EchoEnvironment(turns=3),
                       max_completion_length=64)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    batch = trainer._generate_and_score_completions([trainer.train_dataset[i] for i in range(4)])
    assert (batch["tool_mask"] == 0).any()
    assert batch["advantages"].shape == batch["completion_ids"].shape  # per-token advantages
    trained = (batch["completion_mask"] * batch["tool_mask"]).bool()
    assert (batch["advantages"][~trained] == 0).all() and (batch["returns"][~trained] == 0).all()
    captured = {}

    def keep(name):
        def hook(module, inputs, output):
            output.retain_grad()
            captured[name] = output
        return hook

    final_norm = next(m for n, m in trainer.model.named_modules() if n.endswith("model.norm"))
    handles = [final_norm.register_forward_hook(keep("policy")), trainer.critic.head.register_forward_hook(keep("value"))]
    try:
        trainer._compute_loss(trainer.model, batch).backward()
    finally:
        for h in handles:
            h.remove()
    prompt_len, completion_len = batch["prompt_ids"].size(1), batch["completion_ids"].size(1)
    policy_grad = captured["policy"].grad[:, prompt_len - 1 : prompt_len - 1 + completion_len]
    value_grad = captured["value"].grad  # the head runs on completion positions only: (B, C, 1)
    assert value_grad.shape[:2] == trained.shape
    for name, grad in (("policy", policy_grad), ("value", value_grad)):
        grad = grad.abs().sum(-1)
        assert grad[~trained].max() == 0, name
        assert grad[trained].max() > 0, name


def test_ppo_one_sample_per_prompt_and_config_mapping(tmp_path):
    args = ppo_args(tmp_path, num_iterations=3, num_mini_batches=2, epsilon=0.1)
    assert args.num_generations == 1 and args.num_iterations == 3 and args.steps_per_generation == 2
    assert args.epsilon == 0.1 and args.beta == 0.05
    with pytest.raises(ValueError, match="advantage_mode"):
        ppo_args(tmp_path, advantage_mode="episode")


def test_ppo_learns_toy_task(tiny_model_dir, tokenizer, tmp_path):
    """A short run: the critic's loss falls and the reward improves."""

    def lookup_opened(completions, trajectory, **kwargs):
        return [float("<lookup>" in t.actions[0]) for t in trajectory]

    args = ppo_args(tmp_path, max_steps=60, per_device_train_batch_size=16, learning_rate=3e-3, beta=0.0,
                    critic_learning_rate=1e-2, max_turns=1, max_completion_length=12, lam=1.0, vf_coef=0.5)
    trainer = AgenticPPOTrainer(model=tiny_model_dir, reward_funcs=lookup_opened, args=args,
                                train_dataset=lookup_dataset(256), processing_class=tokenizer,
                                environment=LookupEnvironment)
    trainer.train()
    logs = [r for r in trainer.state.log_history if "loss" in r]
    reward = [r["reward"] for r in logs]
    value_loss = [r["ppo/value_loss"] for r in logs]
    assert sum(reward[-8:]) / 8 > sum(reward[:8]) / 8 + 0.15, reward
    # the critic learns: its loss falls (its explained variance stays near 0 here, NaN on steps whose returns are
    # all equal; in float32 from two passes it once read -2.5e15 on such steps, which the old check relied on)
    assert sum(value_loss[-8:]) / 8 < sum(value_loss[:8]) / 8 / 5, value_loss


@pytest.mark.parametrize("critic,use_lora", [("separate", False), ("separate", True), ("shared", False), ("shared", True)])
def test_critic_gradients_are_cleared_and_clipped_with_the_policy(tiny_model_dir, tokenizer, tmp_path, critic, use_lora):
    """Defect: the critic is not part of trainer.model, so the Trainer's zero_grad() and max_grad_norm never touched
    it; with learning rate 0 its gradient norm grew step after step (each update used the sum of all past
    gradients). Now its gradients are cleared after every optimizer step and clipped together with the policy's."""
    from transformers import TrainerCallback

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM") if use_lora else None
    seen = {"start": [], "norm": []}

    class Probe(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            seen["start"].append([p.grad for p in trainer.extra_parameters()])

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            params = [p for p in list(trainer.model.parameters()) + trainer.extra_parameters() if p.grad is not None]
            seen["norm"].append(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])).item())

    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, environment=lambda: EchoEnvironment(turns=2),
                       peft_config=lora, critic=critic, learning_rate=0.0, critic_learning_rate=0.0, max_steps=3,
                       max_grad_norm=1e-3, vf_coef=1.0)
    assert trainer.extra_parameters(), "the critic has parameters outside the policy model"
    trainer.add_callback(Probe())
    trainer.train()
    assert all(g is None for grads in seen["start"] for g in grads)  # cleared before every step
    assert len(seen["norm"]) == 3 and max(seen["norm"]) <= 1e-3 * 1.01  # clipped jointly with the policy's


def test_each_epoch_draws_a_new_mini_batch_permutation(tiny_model_dir, tokenizer, tmp_path):
    """Before: the same slices in the same order in every epoch."""
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, environment=lambda: EchoEnvironment(turns=1),
                       num_iterations=3, num_mini_batches=2, per_device_train_batch_size=4, max_steps=6,
                       learning_rate=0.0, critic_learning_rate=0.0)
    batches = []
    original = trainer.loss

    def recording_loss(model, batch):
        batches.append(tuple(map(tuple, batch.prompt_ids.tolist())))
        return original(model, batch)

    trainer.loss = recording_loss
    trainer.train()
    assert len(batches) == 6  # 3 epochs x 2 mini-batches over one generation batch of 8
    epochs = [batches[i : i + 2] for i in range(0, 6, 2)]
    assert all(sorted(sum(map(list, e), [])) == sorted(sum(map(list, epochs[0]), [])) for e in epochs)  # same rows
    assert epochs[0] != epochs[1] or epochs[1] != epochs[2]  # in new mini-batches


def test_num_mini_batches_counts_optimizer_steps_whatever_the_accumulation(tmp_path):
    args = ppo_args(tmp_path, num_mini_batches=3, gradient_accumulation_steps=2, per_device_train_batch_size=2)
    assert args.steps_per_generation == 6 and args.generation_batch_size == 12
    with pytest.raises(ValueError, match="num_mini_batches"):
        ppo_args(tmp_path, steps_per_generation=4)


def test_ppo_config_has_no_deprecated_aliases_and_no_grpo_only_arguments(tmp_path):
    """Nothing was released: the former PPOConfig names are documented, not accepted; GRPO's group-advantage
    settings are not PPO arguments (not in --help, refused on the command line)."""
    from transformers import HfArgumentParser

    from trl_agentic import AgenticPPOConfig

    for old in ("kl_coef", "cliprange", "num_ppo_epochs", "missing_eos_penalty"):
        with pytest.raises(TypeError, match=old):
            ppo_args(tmp_path, **{old: 1})
    help_text = HfArgumentParser(AgenticPPOConfig).format_help()
    for grpo_only in ("--std_floor", "--scale_rewards", "--max_extra_generation_rounds", "--zero_variance_groups"):
        assert grpo_only not in help_text
    assert "--vf_coef" in help_text and "--critic_learning_rate" in help_text
    with pytest.raises(ValueError, match="std_floor"):
        HfArgumentParser(AgenticPPOConfig).parse_args_into_dataclasses(
            ["--output_dir", str(tmp_path), "--use_cpu", "--bf16", "false", "--std_floor", "1"])


@pytest.mark.parametrize("detach", [False, True])
def test_shared_critic_without_peft_trains_the_trunk_only_when_asked(tiny_model_dir, tokenizer, tmp_path, detach):
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, environment=lambda: EchoEnvironment(turns=2),
                       critic="shared", critic_detach_backbone=detach)
    batch = trainer.training_batch([trainer.train_dataset[i] for i in range(4)])
    with torch.no_grad():  # a fresh head is zero, which passes no gradient to the trunk
        trainer.critic.head.weight.normal_()
    trainer.model.zero_grad()
    values = trainer._critic_values(batch)
    (values * batch.loss_mask).sum().backward()
    trunk = [p.grad for n, p in trainer.model.named_parameters() if "layers" in n]
    reached = any(g is not None and g.abs().sum() > 0 for g in trunk)
    assert reached is (not detach)
    assert trainer.critic.head.weight.grad is not None


@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_on_policy_round_computes_old_logps_only_for_the_kl_reward(tiny_model_dir, tokenizer, tmp_path, beta):
    """One epoch, one mini-batch: the policy has not moved when the batch is trained on, so the loss's own detached
    log-probs are the old ones (TRL's rule); a forward pass for them is spent only when the KL reward needs them."""
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, environment=lambda: EchoEnvironment(turns=2), beta=beta)
    calls = []
    original = trainer.policy_logps
    trainer.policy_logps = lambda model, batch: calls.append(model is trainer.model) or original(model, batch)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    batch = trainer.training_batch([trainer.train_dataset[i] for i in range(4)])
    assert sum(calls) == (1 if beta else 0)  # the policy's forward (the reference's runs on the reference model)
    assert (batch.old_logps is None) is (beta == 0)
    loss = trainer.loss(trainer.model, batch)
    assert torch.isfinite(loss)
    loss.backward()
    assert trainer.critic.head.weight.grad is not None


def test_critic_learning_rate_reaches_every_critic_parameter_of_a_shared_lora_critic(tiny_model_dir, tokenizer,
                                                                                     tmp_path):
    """Defect: the shared critic's LoRA adapter lives inside the policy model, so the policy's param groups took it
    first and 8 of its 10 parameters trained at the policy's rate. Expected set: the head's two tensors and every
    parameter of the adapter named ``critic`` (found by name, not through the trainer)."""
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, environment=lambda: EchoEnvironment(turns=1),
                       peft_config=lora, critic="shared", learning_rate=1e-6, critic_learning_rate=1e-2)
    trainer.create_optimizer()
    adapter = {id(p) for n, p in trainer.model.named_parameters() if ".critic." in n}
    critic = adapter | {id(trainer.critic.head.weight), id(trainer.critic.head.bias)}
    assert len(critic) == 2 + 2 * 2 * 2  # head + (lora_A, lora_B) x (q_proj, v_proj) x 2 layers
    for group in trainer.optimizer.param_groups:
        ids = {id(p) for p in group["params"]}
        if ids & critic:
            assert ids == critic and group["lr"] == 1e-2
        else:
            assert group["lr"] == 1e-6
    assert sum(len(g["params"]) for g in trainer.optimizer.param_groups if g["lr"] == 1e-2) == 10


def test_ppo_keeps_a_users_epsilon_high(tmp_path):
    """Defect: epsilon_high was overwritten by epsilon without a word."""
    assert ppo_args(tmp_path, epsilon=0.2, epsilon_high=0.28).epsilon_high == 0.28
    assert ppo_args(tmp_path, epsilon=0.1).epsilon_high is None  # TRL then clips at epsilon on both sides


def test_critic_detach_backbone_outside_its_case_is_refused(tiny_model_dir, tokenizer, tmp_path):
    """Defect: critic_detach_backbone=True was silently ignored with a separate critic or a PEFT policy."""
    with pytest.raises(ValueError, match="critic_detach_backbone"):
        ppo_args(tmp_path, critic="separate", critic_detach_backbone=True)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    with pytest.raises(ValueError, match="critic_detach_backbone"):
        _trainer(tiny_model_dir, tokenizer, tmp_path, peft_config=lora, critic="shared", critic_detach_backbone=True)


def test_whiten_rewards_with_turn_advantages_is_refused(tmp_path):
    """Defect: whiten_rewards=True did nothing with advantage_mode='turn'."""
    with pytest.raises(ValueError, match="whiten_rewards"):
        ppo_args(tmp_path, advantage_mode="turn", whiten_rewards=True)
    assert ppo_args(tmp_path, advantage_mode="token", whiten_rewards=True).whiten_rewards


def test_kl_per_sequence_and_the_adaptive_controller_count_only_trained_rows(tiny_model_dir, tokenizer, tmp_path):
    """Defect: rows left out of the loss (here: two whose environment failed) counted as KL 0 in the per-sequence
    mean fed to the adaptive controller and logged as ``ppo/kl_per_sequence``. Expected value from separate forward
    passes of the policy and of the reference model: the mean over trained rows of sum_t m_t (logp - logp_ref)
    (k1), and the controller's update by its formula (Ziegler et al. 2019)."""
    import torch.nn.functional as F

    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, environment=lambda: EchoEnvironment(turns=2),
                       beta=0.05, kl_estimator="k1", target_kl=1e-3, kl_horizon=100.0)
    with torch.no_grad():  # move the policy away from the reference
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    trainer.model.train()
    rows = [dict(trainer.train_dataset[i], fail="step" if i < 2 else None) for i in range(4)]
    batch = trainer.training_batch(rows)
    trained = batch.loss_mask.bool()
    assert trained.any(-1).tolist() == [False, False, True, True]

    def logps(model):
        ids = torch.cat([batch.prompt_ids, batch.completion_ids], 1)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=torch.cat([batch.prompt_mask, batch.completion_mask], 1)).logits
        width = batch.completion_ids.size(1)
        return F.log_softmax(logits[:, -width - 1 : -1].float(), -1).gather(-1, batch.completion_ids.unsqueeze(-1))[..., 0]

    per_row = ((logps(trainer.model) - logps(trainer.ref_model)) * trained).sum(-1)
    expected = per_row[2:].mean().item()
    assert abs(expected) > 1e-3
    assert trainer._metrics["train"]["ppo/kl_per_sequence"][-1] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    error = min(max(expected / 1e-3 - 1.0, -0.2), 0.2)
    assert trainer.kl_coef == pytest.approx(0.05 * (1 + error * 4 / 100.0), rel=1e-6)


@pytest.mark.parametrize("critic", ["separate", "shared"])
def test_lora_on_all_linear_layers_builds_the_critic(tiny_model_dir, tokenizer, tmp_path, critic):
    """PEFT rewrites target_modules="all-linear" in place into the policy's module paths; the critic's adapter must
    start from the config the user passed (found by the real-vLLM suite: NoMatchingPeftModuleError)."""
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, peft_config=lora, critic=critic)
    assert any(p.requires_grad for p in trainer.extra_parameters())


@pytest.mark.parametrize("critic,use_lora", [("separate", False), ("shared", True)])
def test_critic_warmup_trains_the_critic_alone_for_its_steps(tiny_model_dir, tokenizer, tmp_path, critic, use_lora):
    """verl's critic_warmup: the first critic_warmup_steps optimizer steps leave the policy's weights as they were and
    move the critic; the next step moves the policy."""
    from transformers import TrainerCallback

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM") if use_lora else None
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, environment=lambda: EchoEnvironment(turns=2),
                       peft_config=lora, critic=critic, critic_warmup_steps=2, max_steps=3, learning_rate=1e-2,
                       critic_learning_rate=1e-2)

    def policy_weights():
        return [p.detach().clone() for n, p in trainer.model.named_parameters()
                if p.requires_grad and ".critic." not in n]

    snapshots = {"policy": [policy_weights()], "head": [trainer.critic.head.weight.detach().clone()]}

    class Snapshot(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            snapshots["policy"].append(policy_weights())
            snapshots["head"].append(trainer.critic.head.weight.detach().clone())

    trainer.add_callback(Snapshot())
    trainer.train()
    policy, head = snapshots["policy"], snapshots["head"]
    assert len(policy) == 4 and policy[0]
    same = [all(torch.equal(a, b) for a, b in zip(policy[0], policy[step])) for step in range(1, 4)]
    assert same == [True, True, False]
    assert all(not torch.equal(head[step - 1], head[step]) for step in range(1, 4))
    logs = [r for r in trainer.state.log_history if "loss" in r]
    assert len(logs) == 3 and all("ppo/value_loss" in r for r in logs)
    with pytest.raises(ValueError, match="critic_warmup_steps"):
        ppo_args(tmp_path, critic_warmup_steps=-1)
