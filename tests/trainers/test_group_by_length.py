"""group_by_length: a round's samples in micro-batches of similar completion length, each computed at its own width,
with the same loss and the same training as TRL's random micro-batches padded to the round's width."""

import pytest
import torch
from datasets import Dataset
from helpers import EchoEnvironment, agentic_args, ppo_args

from trl_agentic import AgenticGRPOTrainer, AgenticPPOTrainer
from trl_agentic.compat import TRLBatch, by_completion_length


def _batch(lengths, width, prompt_width=3):
    rows = len(lengths)
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    return TRLBatch({
        "prompt_ids": torch.arange(rows * prompt_width).view(rows, prompt_width),
        "prompt_mask": torch.ones(rows, prompt_width, dtype=torch.long),
        "completion_ids": torch.arange(rows * width).view(rows, width),
        "completion_mask": mask,
        "advantages": torch.arange(rows, dtype=torch.float),
        "num_items_in_batch": mask.sum(),
        "old_per_token_logps": torch.randn(rows, width),
        "tool_mask": torch.ones(rows, width, dtype=torch.long),
        "names": [f"row{i}" for i in range(rows)],
    })


def test_trimmed_cuts_the_padding_every_row_has():
    batch = _batch([2, 5, 3], width=8, prompt_width=8)  # a prompt as wide as the completions is never cut
    cut = batch.trimmed()
    assert cut.completion_ids.shape == (3, 5) and cut.data["old_per_token_logps"].shape == (3, 5)
    assert cut.data["tool_mask"].shape == (3, 5) and cut.prompt_ids.shape == (3, 8)
    assert torch.equal(cut.completion_ids, batch.completion_ids[:, :5])
    assert torch.equal(cut.advantages, batch.advantages) and cut.num_items_in_batch == batch.num_items_in_batch
    assert batch.trimmed(multiple=4).completion_ids.shape == (3, 8)  # 5 rounded up to 8: nothing to cut
    assert batch.trimmed(multiple=2).completion_ids.shape == (3, 6)
    assert _batch([8, 1], width=8).trimmed() is not None and _batch([8, 1], width=8).trimmed().completion_ids.shape[1] == 8
    assert _batch([0, 0], width=4).trimmed().completion_ids.shape == (2, 1)  # empty rows keep one column
    nothing = _batch([0, 0], width=0)
    assert nothing.trimmed() is nothing and nothing.completion_lengths().tolist() == [0, 0]


def test_by_completion_length_orders_every_row_value_longest_first():
    batch = _batch([2, 5, 3, 5], width=6)
    ordered = by_completion_length(batch.data)
    assert TRLBatch(ordered).completion_lengths().tolist() == [5, 5, 3, 2]
    assert ordered["names"] == ["row1", "row3", "row2", "row0"]  # ties keep their order
    assert ordered["advantages"].tolist() == [1.0, 3.0, 2.0, 0.0]
    assert torch.equal(ordered["prompt_ids"], batch.prompt_ids[[1, 3, 2, 0]])
    assert ordered["num_items_in_batch"] is batch.data["num_items_in_batch"]


def turns_reward(completions, trajectory, **kwargs):
    return [t.num_agent_tokens / 10 for t in trajectory]


def _train(trainer_class, make_args, tmp_path, group_by_length, model_dir, tokenizer, **overrides):
    """Two steps of 4 samples in 2 micro-batches; episodes of 1 to 3 turns (so completions of different lengths)."""
    args = make_args(tmp_path / str(group_by_length), per_device_train_batch_size=2, gradient_accumulation_steps=2,
                     max_steps=2, group_by_length=group_by_length, **overrides)
    rows = Dataset.from_list([{"prompt": f"count {i}", "turns": 1 + (i * 5) % 3} for i in range(8)])
    trainer = trainer_class(model=model_dir, reward_funcs=turns_reward, args=args, train_dataset=rows,
                            processing_class=tokenizer, environment=lambda: EchoEnvironment(turns=1))
    widths, losses = [], []
    loss = trainer.loss

    def recording_loss(model, batch):
        widths.append((batch.completion_ids.shape[1], batch.completion_lengths().tolist()))
        value = loss(model, batch)
        losses.append(value.item())
        return value

    trainer.loss = recording_loss
    trainer.train()
    params = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    step_losses = [losses[i] + losses[i + 1] for i in range(0, len(losses), 2)]  # what one optimizer step trains
    return step_losses, params, widths


@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_grouped_micro_batches_train_as_trls_random_ones(tiny_model_dir, tokenizer, tmp_path, beta):
    """GRPO's default loss (dapo) is normalized per round: the same optimizer steps, micro-batches of less width
    (with ``beta``, the reference log-probs by length too)."""
    plain_losses, plain_params, plain_widths = _train(AgenticGRPOTrainer, agentic_args, tmp_path, False,
                                                      tiny_model_dir, tokenizer, beta=beta)
    losses, params, widths = _train(AgenticGRPOTrainer, agentic_args, tmp_path, True, tiny_model_dir, tokenizer,
                                    beta=beta)
    assert losses == pytest.approx(plain_losses, rel=1e-4, abs=1e-6)
    for name, value in plain_params.items():
        torch.testing.assert_close(params[name], value, rtol=1e-4, atol=1e-6)
    _assert_grouped(widths, plain_widths)


def test_ppo_groups_its_micro_batches(tiny_model_dir, tokenizer, tmp_path):
    """PPO's value loss is a mean per micro-batch (as bnpo's policy loss), so grouping changes its token weighting:
    the layout is checked, and that it trains."""
    _, _, plain_widths = _train(AgenticPPOTrainer, ppo_args, tmp_path, False, tiny_model_dir, tokenizer)
    losses, _, widths = _train(AgenticPPOTrainer, ppo_args, tmp_path, True, tiny_model_dir, tokenizer)
    assert all(torch.isfinite(torch.tensor(losses))) and losses != [0.0] * len(losses)
    _assert_grouped(widths, plain_widths)


def _assert_grouped(widths, plain_widths):
    """TRL's micro-batches are padded to their round's longest completion; grouped ones to their own, the longest
    first."""
    for first, second in zip(plain_widths[::2], plain_widths[1::2]):
        assert first[0] == second[0] == max(first[1] + second[1])
    for first, second in zip(widths[::2], widths[1::2]):
        assert first[0] == max(first[1]) and second[0] == max(second[1])
        assert min(first[1]) >= max(second[1])
    assert sum(width for width, _ in widths) < sum(width for width, _ in plain_widths)


def test_the_rounds_log_probs_are_computed_by_length_too(tiny_model_dir, tokenizer, tmp_path):
    """The old and reference log-probs of a round (computed in chunks of the micro-batch size) come from chunks of
    rows of similar length, each at its own width, and equal TRL's chunks' on every completion position."""
    args = agentic_args(tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=2, beta=0.1,
                        group_by_length=True)
    rows = Dataset.from_list([{"prompt": f"count {i}", "turns": 1 + (i * 5) % 3} for i in range(8)])
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=turns_reward, args=args, train_dataset=rows,
                                 processing_class=tokenizer, environment=lambda: EchoEnvironment(turns=1))
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    batch = trainer.generation_round([trainer.train_dataset[i] for i in range(4)]).batch
    lengths = batch.completion_lengths()
    assert len(set(lengths.tolist())) > 1
    widths = []
    compute = trainer._get_per_token_logps_and_entropies

    def recording(model, input_ids, attention_mask, logits_to_keep, **kwargs):
        widths.append(logits_to_keep)
        return compute(model, input_ids, attention_mask, logits_to_keep, **kwargs)

    trainer._get_per_token_logps_and_entropies = recording
    grouped = trainer.policy_logps(trainer.model, batch)
    trainer.group_by_length = False
    plain = trainer.policy_logps(trainer.model, batch)
    mask = batch.completion_mask.bool()
    assert grouped.shape == plain.shape
    torch.testing.assert_close(grouped[mask], plain[mask], rtol=1e-5, atol=1e-5)
    longest = lengths.sort(descending=True).values
    assert widths[:2] == [int(longest[0]), int(longest[2])] and widths[2] == batch.completion_ids.size(1)
