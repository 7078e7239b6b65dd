"""AgenticPPOTrainer: critic options, GAE modes, masking of policy and value gradients, a short learning run."""

import pytest
import torch
from peft import LoraConfig

from helpers import EchoEnvironment, lookup_dataset, ppo_args
from trl_agentic import AgenticPPOTrainer
from trl_agentic.critic import SharedValueHead, ValueModel
from trl_agentic.toy import LookupEnvironment, lookup_reward


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
    """A short run: the critic's explained variance rises and the reward improves."""

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
    # explained variance is undefined (logged as None/NaN) on steps where every return is equal
    ev = [r["ppo/explained_variance"] for r in logs if r["ppo/explained_variance"] == r["ppo/explained_variance"]
          and r["ppo/explained_variance"] is not None]
    assert sum(reward[-8:]) / 8 > sum(reward[:8]) / 8 + 0.15, reward
    assert len(ev) >= 10 and sum(ev[-5:]) / 5 > sum(ev[:5]) / 5, ev
