"""TRL's own tests mock ``model.generate`` with a function returning a plain tensor of ids (prompt and completion),
as transformers' ``generate`` does without ``return_dict_in_generate``; ``HFGenerator`` accepts it (no log-probs
then), so those tests run with ``AgenticGRPOTrainer`` swapped in."""

from unittest.mock import patch

import torch
from helpers import EchoEnvironment, agentic_args, lookup_dataset

from trl_agentic import AgenticGRPOTrainer
from trl_agentic.rollout.generation import HFGenerator

SAMPLED = [300, 301, 302]  # whole words of the toy tokenizer


def fake_generate_for(eos: int, pad: int):
    """TRL's test double (``tests/test_grpo_trainer.py``): the input ids followed by fixed completion ids. The first
    call's rows end without an end id (the turn ends at its budget, the episode goes on); later calls end with the
    end id, the odd rows early and padded, as a batched ``generate`` pads finished rows."""
    calls = []

    def fake_generate(input_ids, **kwargs):
        calls.append(input_ids.shape[0])
        if len(calls) == 1:
            rows = [SAMPLED + SAMPLED[:1]] * input_ids.shape[0]
        else:
            rows = [SAMPLED + [eos] if i % 2 == 0 else SAMPLED[:1] + [eos, pad, pad]
                    for i in range(input_ids.shape[0])]
        return torch.cat([input_ids, torch.tensor(rows, device=input_ids.device)], dim=1)

    return fake_generate, calls


def test_hf_generator_reads_a_plain_tensor(tiny_model, tokenizer):
    fake, calls = fake_generate_for(tokenizer.eos_token_id, tokenizer.pad_token_id)
    generator = HFGenerator(tiny_model, tokenizer, return_logprobs=True)
    with patch.object(tiny_model, "generate", side_effect=fake):
        generator.generate([[5, 6, 7], [8]], 8, [], [tokenizer.eos_token_id])
        out = generator.generate([[5, 6, 7], [8]], 8, [], [tokenizer.eos_token_id])
    assert calls == [2, 2]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    assert [g.ids for g in out] == [SAMPLED + [eos], SAMPLED[:1] + [eos, pad, pad]]  # the engine cuts at the end id
    assert [g.logprobs for g in out] == [None, None]  # a tensor carries no scores


def test_trainer_step_with_an_environment_and_trls_generate_double(tiny_model_dir, tokenizer, tmp_path):
    seen = []

    class Recording(AgenticGRPOTrainer):
        def rollout(self, rows, ahead=True):
            rollouts = super().rollout(rows, ahead)
            seen.extend(rollouts.runs)
            return rollouts

    trainer = Recording(model=tiny_model_dir, reward_funcs=lambda completions, **kw: [1.0] * len(completions),
                        args=agentic_args(tmp_path, max_steps=1, max_turns=3, max_tokens_per_turn=4),
                        train_dataset=lookup_dataset(8), processing_class=tokenizer,
                        environment=lambda: EchoEnvironment(turns=2))
    fake, calls = fake_generate_for(tokenizer.eos_token_id, tokenizer.pad_token_id)
    with patch.object(trainer.model, "generate", side_effect=fake):
        trainer.train()
    assert calls == [4, 4]  # one call per turn, 2 turns
    assert len(seen) == 4
    for t in seen:  # each turn keeps what the double sampled, up to and with the end id
        turns = [t.completion_ids[a:b] for a, b in t.turn_spans]
        assert turns[0] == SAMPLED + SAMPLED[:1]
        assert turns[1] in (SAMPLED + [tokenizer.eos_token_id], SAMPLED[:1] + [tokenizer.eos_token_id])
        assert len(turns) == 2
    assert trainer.state.global_step == 1
