"""Contract tests for the TRL boundary (trl_agentic.compat): a TRL upgrade that breaks one of its hooks fails here,
with the name of what changed."""

import pytest
import torch
import trl
from helpers import EchoEnvironment, agentic_args, lookup_dataset

from trl_agentic import AgenticGRPOTrainer, compat
from trl_agentic.toy import lookup_reward
from trl_agentic.trainers.base import CLIPPED_LOSS_TYPES


def _trainer(tiny_model_dir, tokenizer, tmp_path, **overrides):
    args = agentic_args(tmp_path, **{"max_completion_length": 64, **overrides})
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=lookup_reward, args=args,
                                 train_dataset=lookup_dataset(8), processing_class=tokenizer,
                                 environment=lambda: EchoEnvironment(turns=3))
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2
    return trainer


def test_trl_version_in_tested_range():
    from packaging.version import Version

    assert compat.TESTED_TRL[0] <= Version(trl.__version__) < compat.TESTED_TRL[1]


def test_private_signatures_unchanged():
    assert compat.signature_mismatches() == []


def test_trl_attributes_we_read_have_the_values_we_assume(tiny_model_dir, tokenizer, tmp_path):
    """Every GRPOTrainer attribute the trainers read (tests/test_boundary.py lists them), with the value it must
    have for this config: a rename or a change of meaning fails here, not only a removal."""
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, beta=0.25, epsilon=0.15, epsilon_high=0.3,
                       loss_type="bnpo", importance_sampling_level="sequence", scale_rewards="batch",
                       multi_objective_aggregation="normalize_then_sum", num_iterations=2)
    assert torch.equal(trainer.reward_weights, torch.ones(1)) and trainer.reward_func_names == ["lookup_reward"]
    assert (trainer.num_generations, trainer.num_generations_eval) == (2, 2)
    assert trainer.eos_token_ids == [tokenizer.eos_token_id]
    assert trainer.generation_config.max_new_tokens == 64
    assert (trainer.beta, trainer.epsilon_low, trainer.epsilon_high) == (0.25, 0.15, 0.3)
    assert (trainer.loss_type, trainer.importance_sampling_level, trainer.scale_rewards) == ("bnpo", "sequence", "batch")
    assert trainer.multi_objective_aggregation == "normalize_then_sum" and trainer.num_iterations == 2
    assert trainer.use_vllm is False and trainer.vllm_importance_sampling_correction is True
    assert trainer.max_completion_length == 64 and trainer.aux_loss_enabled is False
    assert trainer.ref_model is not None and trainer.processing_class is tokenizer
    assert (trainer._step, trainer._buffered_inputs) == (0, None)
    trainer.add_metrics({"agentic/probe": 1.0})
    assert trainer._metrics["train"]["agentic/probe"] == [1.0]
    trainer.log_metrics("train", {"train_loss": 0.5})  # transformers' Trainer.log_metrics(split, metrics)
    from trl.trainer.utils import (  # noqa: F401 - the boundary's _prepare_inputs uses them
        shuffle_sequence_dict,
        split_pixel_values_by_grid,
        split_tensor_dict,
        unsplit_pixel_values_by_grid,
    )


def test_generation_round_hands_back_rows_rewards_and_trajectories(tiny_model_dir, tokenizer, tmp_path):
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path)
    rows = [trainer.train_dataset[i] for i in range(4)]
    scored = trainer.generation_round(rows)
    batch = scored.batch
    assert scored.rewards_per_func.shape == (4, 1) and scored.rows == rows
    assert len(scored.trajectories) == 4 and all("trajectory" not in row for row in rows)  # rows left untouched
    # the typed accessor's layout claims hold on TRL's real batch
    assert (batch.prompt_mask[:, -1] == 1).all()  # prompts are left-padded
    lengths = [len(t.completion_ids) for t in scored.trajectories]
    for row, n in enumerate(lengths):
        assert batch.completion_mask[row, :n].all() and not batch.completion_mask[row, n:].any()  # right-padded
        assert batch.env_mask[row, :n].tolist() == scored.trajectories[row].env_mask
    assert batch.num_items_in_batch.item() == batch.loss_mask.sum().item()
    assert set(batch.row_keys()) >= {"prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "tool_mask"}


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("bias_correction", [False, True])
@pytest.mark.parametrize("loss_type", CLIPPED_LOSS_TYPES)
def test_clipped_loss_with_k3_equals_trls_loss(tiny_model_dir, tokenizer, tmp_path, loss_type, level, bias_correction):
    """The contract behind the k1/k2 path and PPO's policy loss: our clipped loss with TRL's estimator (k3) equals
    TRL's own _compute_loss on the same batch, for every clipped loss type, IS level and bias correction, with the
    policy away from both the reference and the old policy."""
    beta = 0.3
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, beta=beta, loss_type=loss_type,
                       importance_sampling_level=level, use_bias_correction_kl=bias_correction)
    batch = trainer.training_batch([trainer.train_dataset[i] for i in range(4)])
    with torch.no_grad():  # make the policy differ from the reference and from the old policy
        batch.data["ref_per_token_logps"] = batch.ref_logps + 0.2 * torch.randn_like(batch.ref_logps)
        batch.old_logps = trainer.policy_logps(trainer.model, batch) + 0.1 * torch.randn_like(batch.ref_logps)
    batch.advantages = torch.tensor([1.0, -0.5, 0.25, -2.0])
    trl_loss = trainer.trl_loss(trainer.model, batch)
    ours = trainer.clipped_loss(trainer.model, batch, kl_estimator="k3")
    torch.testing.assert_close(ours, trl_loss, rtol=1e-5, atol=1e-6)
    without_kl = trainer.clipped_loss(trainer.model, batch)
    assert not torch.isclose(without_kl, trl_loss)  # the KL term was really there
    assert trainer.beta == beta


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "vespo"])
def test_k1_and_k2_refuse_what_the_clipped_loss_does_not_implement(tiny_model_dir, tokenizer, tmp_path, loss_type):
    with pytest.raises(ValueError, match="loss_type"):
        _trainer(tiny_model_dir, tokenizer, tmp_path, beta=0.1, kl_estimator="k2", loss_type=loss_type)
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        _trainer(tiny_model_dir, tokenizer, tmp_path, beta=0.1, kl_estimator="k1", top_entropy_quantile=0.5)
    _trainer(tiny_model_dir, tokenizer, tmp_path, beta=0.1, kl_estimator="k3", loss_type=loss_type)  # TRL's loss


def test_non_finite_values_at_masked_positions_do_not_reach_the_loss(tiny_model_dir, tokenizer, tmp_path):
    """inf in the reference / old log-probs at observation positions: TRL masks by multiplication (0 * inf = NaN);
    the boundary neutralises masked positions first, so the loss equals the one with finite values there."""
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, beta=0.2, kl_estimator="k3")
    batch = trainer.training_batch([trainer.train_dataset[i] for i in range(4)])
    masked = ~batch.loss_mask.bool()
    assert masked.any()
    clean = trainer.loss(trainer.model, batch)
    for key in ("ref_per_token_logps",):
        batch.data[key] = batch.data[key].masked_fill(masked, float("-inf"))
    for estimator in ("k3", "k2", "k1"):
        trainer.args.kl_estimator = estimator
        loss = trainer.loss(trainer.model, batch)
        assert torch.isfinite(loss), estimator
    trainer.args.kl_estimator = "k3"
    torch.testing.assert_close(trainer.loss(trainer.model, batch), clean)


def test_one_generation_config_keeps_grpo_checks(tmp_path):
    """PPO's num_generations=1 passes GRPOConfig's checks, also with an odd generation batch, and the rest of
    GRPOConfig's validation still runs."""
    from helpers import ppo_args

    args = ppo_args(tmp_path, per_device_train_batch_size=3)
    assert args.num_generations == 1 and type(args.num_generations) is int and args.generation_batch_size == 3
    with pytest.raises(ValueError, match="auto_find_batch_size"):
        ppo_args(tmp_path, auto_find_batch_size=True)


def test_trl_parse_response_contract():
    """``compat.parse_response`` is TRL's tool-loop parser: a Qwen call comes back as typed ``tool_calls``, a call it
    cannot read as plain text (``trl.chat_template_utils.parse_response`` in TRL 1.16)."""
    from conventions import build_convention
    from trl import add_response_schema

    from trl_agentic.compat import parse_response

    def add(a: int, b: int) -> int:
        """Add.

        Args:
            a: First.
            b: Second.
        """
        return a + b

    tok = add_response_schema(build_convention("qwen2.5-instruct").load_tokenizer())
    prefix = tok.apply_chat_template([{"role": "user", "content": "x"}], tools=[add], add_generation_prompt=True,
                                     tokenize=True, return_dict=False)
    good = tok('<tool_call>\n{"name": "add", "arguments": {"a": "1", "b": 2}}\n</tool_call><|im_end|>',
               add_special_tokens=False)["input_ids"]
    bad = tok('<tool_call>\n{"name": "add", </tool_call><|im_end|>', add_special_tokens=False)["input_ids"]
    assert parse_response(tok, good, prefix, [add])["tool_calls"] == [
        {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]
    assert parse_response(tok, bad, prefix, [add]) == {"role": "assistant",
                                                        "content": '<tool_call>\n{"name": "add", </tool_call>'}
    # a failed rollout's empty turn (transformers >= 5.24 reads [] as an empty batch and returns []): one empty
    # assistant message, and so is a turn of the end token alone
    assert parse_response(tok, [], prefix, [add]) == {"role": "assistant", "content": ""}
    assert parse_response(tok, tok("<|im_end|>", add_special_tokens=False)["input_ids"], prefix, [add]) == {
        "role": "assistant", "content": ""}


def test_reward_completions_of_a_failed_rollout():
    """What a reward function receives for a rollout whose environment failed before the model spoke (empty
    completion ids), for each prompt kind: empty text, or one empty assistant message."""
    from conventions import build_convention
    from trl import add_response_schema

    from trl_agentic.rewards.inputs import reward_completions
    from trl_agentic.trajectory import Trajectory

    tok = add_response_schema(build_convention("qwen2.5-instruct").load_tokenizer())
    chat = Trajectory(prompt=[{"role": "user", "content": "x"}], prompt_ids=[1, 2], completion_ids=[])
    text = Trajectory(prompt="x", prompt_ids=[1, 2], completion_ids=[])
    assert reward_completions([chat, text], tok) == [[{"role": "assistant", "content": ""}], ""]
