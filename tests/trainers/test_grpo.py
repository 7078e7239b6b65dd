"""AgenticGRPOTrainer: drop-in parity, real training steps, masking through TRL's loss, metrics."""


import pytest
import torch
from helpers import EchoEnvironment, agentic_args, completion_hidden_grad, lookup_dataset
from peft import LoraConfig

from trl_agentic import AgenticGRPOTrainer
from trl_agentic.toy import LookupEnvironment, lookup_reward
from trl_agentic.trajectory import load_trajectories


def length_reward(completions, **kwargs):
    return [float(len(c)) / 10 for c in completions]


def agent_tokens_reward(completions, trajectory, **kwargs):
    """Varies between completions of a group, so that every step has non-zero advantages."""
    return [t.num_agent_tokens / 10 for t in trajectory]


def _losses(trainer):
    return [row["loss"] for row in trainer.state.log_history if "loss" in row]


def test_without_environment_equals_grpo_trainer(tiny_model_dir, tokenizer, tmp_path):
    """Invariant 4: same seed, same data, same losses as plain GRPOTrainer."""
    from trl import GRPOConfig, GRPOTrainer

    common = dict(per_device_train_batch_size=4, num_generations=2, max_completion_length=8, max_steps=2,
                  learning_rate=1e-3, logging_steps=1, report_to="none", use_cpu=True, bf16=False, seed=0,
                  save_strategy="no", beta=0.1)
    data = lookup_dataset(8)
    runs = []
    for cls, cfg_cls in [(GRPOTrainer, GRPOConfig), (AgenticGRPOTrainer, agentic_args)]:
        if cfg_cls is GRPOConfig:
            args = GRPOConfig(output_dir=str(tmp_path / "a"), **common)
        else:
            args = cfg_cls(tmp_path, **{**common, "max_tokens_per_turn": 8})
        trainer = cls(model=tiny_model_dir, reward_funcs=length_reward, args=args, train_dataset=data,
                      processing_class=tokenizer)
        trainer.train()
        runs.append((_losses(trainer), [r.get("kl") for r in trainer.state.log_history if "loss" in r]))
    assert runs[0] == runs[1]
    assert len(runs[0][0]) == 2


@pytest.mark.parametrize("use_lora", [True, False])
def test_two_training_steps_with_environment(tiny_model_dir, tokenizer, tmp_path, use_lora):
    args = agentic_args(tmp_path, beta=0.05, trajectory_dir=str(tmp_path / "traj"))
    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM") if use_lora else None
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=[lookup_reward, agent_tokens_reward], args=args,
                                 train_dataset=lookup_dataset(8), processing_class=tokenizer,
                                 environment=LookupEnvironment, peft_config=peft_config)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(before[n], after[n].detach()) for n in before)
    logs = [r for r in trainer.state.log_history if "loss" in r]
    assert len(logs) == 2
    for row in logs:
        assert row["agentic/mask_audit"] == 0
        assert 1 <= row["agentic/turns_mean"] <= 3
        assert 0 <= row["agentic/observation_token_share"] < 1
        assert "kl" in row
    rows = list(load_trajectories(tmp_path / "traj" / "trajectories-rank0.jsonl"))
    assert len(rows) == 2 * 4 and {"completion_ids", "env_mask", "actions", "step"} <= set(rows[0])


def _generation_round(trainer, n=4):
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop; we call the loss directly
    return trainer.generation_round([trainer.train_dataset[i] for i in range(n)])


def _generation_batch(trainer, n=4):
    return _generation_round(trainer, n).batch.data


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_zero_gradient_at_observation_positions(tiny_model_dir, tokenizer, tmp_path, estimator):
    """Invariant 2, the hard way: d loss / d (logits input) is exactly 0 wherever the env mask is 0, KL on."""
    args = agentic_args(tmp_path, beta=0.5, kl_estimator=estimator, max_completion_length=64, max_steps=1)
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=lookup_reward, args=args,
                                 train_dataset=lookup_dataset(8), processing_class=tokenizer,
                                 environment=lambda: EchoEnvironment(turns=3))
    batch = _generation_batch(trainer)
    # non-zero advantages everywhere so that the policy term would push every trained position
    batch["advantages"] = torch.linspace(-1.0, 1.0, batch["advantages"].numel())
    assert (batch["tool_mask"] == 0).any(), "the batch should contain observation tokens"
    completion_grad = completion_hidden_grad(trainer.model, batch, lambda: trainer._compute_loss(trainer.model, batch))
    trained = (batch["completion_mask"] * batch["tool_mask"]).bool()
    assert completion_grad[~trained].max() == 0
    assert completion_grad[trained].min() > 0  # and it is not zero at any trained position


def test_reward_functions_receive_trajectories(tiny_model_dir, tokenizer, tmp_path):
    seen = []

    def spy(completions, trajectory, **kwargs):
        seen.extend(trajectory)
        return [0.0] * len(completions)

    args = agentic_args(tmp_path, max_steps=1)
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=spy, args=args, train_dataset=lookup_dataset(8),
                                 processing_class=tokenizer, environment=LookupEnvironment)
    trainer.train()
    assert len(seen) == 4 and all(t.num_turns >= 1 for t in seen)


def test_mask_truncated_trajectories_zeroes_their_mask(tiny_model_dir, tokenizer, tmp_path):
    args = agentic_args(tmp_path, mask_truncated_trajectories=True, max_completion_length=8, max_tokens_per_turn=8)
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=lookup_reward, args=args,
                                 train_dataset=lookup_dataset(8), processing_class=tokenizer,
                                 environment=LookupEnvironment)
    round_ = _generation_round(trainer)
    assert any(t.truncated for t in round_.trajectories)
    for row, t in enumerate(round_.trajectories):
        if t.truncated:
            assert round_.batch.env_mask[row].sum() == 0


def test_bad_combinations_are_refused(tiny_model_dir, tokenizer, tmp_path):
    with pytest.raises(ValueError, match="mask_truncated_trajectories"):
        AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=lookup_reward,
                           args=agentic_args(tmp_path, mask_truncated_completions=True),
                           train_dataset=lookup_dataset(8), processing_class=tokenizer, environment=LookupEnvironment)
    with pytest.raises(ValueError, match="kl_estimator"):
        agentic_args(tmp_path, kl_estimator="k4")


def test_chat_mode_training_step(tiny_model_dir, tokenizer, tmp_path):
    """Conversational prompts, observations as tool messages rendered by the chat template."""
    args = agentic_args(tmp_path, rollout_mode="chat", max_completion_length=64, max_steps=1)
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=agent_tokens_reward, args=args,
                                 train_dataset=lookup_dataset(8, conversational=True), processing_class=tokenizer,
                                 environment=lambda: EchoEnvironment(turns=2))
    round_ = _generation_round(trainer)
    batch = round_.batch.data
    for row, t in enumerate(round_.trajectories):
        assert tokenizer.decode(t.prompt_ids).endswith("<|im_start|>assistant\n")
        if t.num_turns == 2:
            # the end-of-turn token is sampled or, when a budget ended the turn, added as part of the observation
            first_turn = tokenizer.decode(t.completion_ids[: t.turn_spans[1][0]])
            assert first_turn.endswith("<|im_end|>\n<|im_start|>tool\n<result>1</result><|im_end|>\n<|im_start|>assistant\n")
    assert (batch["tool_mask"] == 0).any()
    trainer.train()
    assert trainer.state.log_history[0]["agentic/mask_audit"] == 0


@pytest.mark.parametrize("mask_observations", [True, False])
def test_mask_observations_switch(tiny_model_dir, tokenizer, tmp_path, mask_observations):
    """Default: TRL's mask of trained tokens is the env mask. mask_observations=False (Search-R1's ablation, with a
    warning) trains observation tokens too; the mask audit still passes (it allows them then)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = agentic_args(tmp_path, mask_observations=mask_observations, max_completion_length=64, max_steps=1)
    assert any("mask_observations=False" in str(w.message) for w in caught) == (not mask_observations)
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=agent_tokens_reward, args=args,
                                 train_dataset=lookup_dataset(8), processing_class=tokenizer,
                                 environment=lambda: EchoEnvironment(turns=3))
    round_ = _generation_round(trainer)
    assert any(t.num_observation_tokens for t in round_.trajectories)
    for row, t in enumerate(round_.trajectories):
        mask = round_.batch.env_mask[row, : len(t.completion_ids)].tolist()
        assert mask == (t.env_mask if mask_observations else [1] * len(t.completion_ids))
    trainer.train()
    assert trainer.state.log_history[0]["agentic/mask_audit"] == 0
