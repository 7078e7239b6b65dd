"""Our rollout engine on a real vLLM engine (``VLLMGenerator`` over ``vllm.LLM``): the ids vLLM sampled are the ids
the trajectory trains on, in text and chat mode, with every end id, stop string and turn budget honoured; vLLM's
float32 greedy tokens and log-probs equal the HF model's."""

import pytest
import torch
from helpers import EchoEnvironment, Recording

from trl_agentic import run_rollouts
from trl_agentic.rollout.audit import unsampled_trained
from trl_agentic.rollout.generation import HFGenerator
from trl_agentic.rollout.metrics import logprob_gap
from trl_agentic.rollout.vllm import VLLMGenerator

pytestmark = pytest.mark.vllm

PROMPTS = ["find key k12\n", "what is the value of key k7\n", "please use the tool\n", "12 + 30 = "]


def _ids(tokenizer, texts):
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_greedy_ids_and_logprobs_equal_the_hf_model_in_float32(llm, vllm_model_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(vllm_model_dir, dtype=torch.float32).eval()
    config = model.generation_config
    config.do_sample = False
    hf = HFGenerator(model, tokenizer, config, return_logprobs=True)
    prompts, eos = _ids(tokenizer, PROMPTS), [tokenizer.eos_token_id]
    ours = VLLMGenerator(llm, greedy=True).generate(prompts, 12, [], eos)
    theirs = hf.generate(prompts, 12, [], eos)
    for a, b in zip(ours, theirs):
        assert a.ids == b.ids[: len(a.ids)] and len(a.ids) == 12
        mean, largest = logprob_gap(torch.tensor(a.logprobs), torch.tensor(b.logprobs), torch.ones(12))
        assert largest < 1e-3, (mean, largest)


def test_every_end_id_and_stop_string_cuts_where_the_sampled_sequence_says(llm, tokenizer):
    """With one seed the sampled sequence is fixed; an extra end id or a stop string taken from it must end the
    output at its first occurrence (the end id kept, the stop string the last thing decoded)."""
    prompt = _ids(tokenizer, PROMPTS[:1])
    sampler = VLLMGenerator(llm, temperature=1.0, seed=1234)
    reference = sampler.generate(prompt, 24, [], [tokenizer.eos_token_id])[0].ids
    assert len(reference) == 24, "the seed's sample hit EOS early: pick another seed"
    end = reference[5]
    cut = sampler.generate(prompt, 24, [], [tokenizer.eos_token_id, end])[0].ids
    assert cut == reference[: reference.index(end) + 1]

    clean = [tokenizer.decode([t]).strip() for t in reference[6:]]  # a token that decodes to whole characters
    stop = next((text for text in clean if text.isascii() and text.isprintable() and text), None)
    assert stop, "no ASCII token in the seed's sample: pick another seed"
    stopped = sampler.generate(prompt, 24, [stop], [tokenizer.eos_token_id])[0].ids
    assert stopped == reference[: len(stopped)], "a stop string changed what was sampled"
    assert stop in tokenizer.decode(stopped) and stop not in tokenizer.decode(stopped[:-1])


@pytest.mark.parametrize("mode", ["text", "chat"])
def test_multi_turn_rollouts_train_exactly_the_ids_vllm_sampled(llm, tokenizer, mode):
    rows = [{"prompt": [{"role": "user", "content": p}] if mode == "chat" else p, "turns": 3} for p in PROMPTS]
    generator = Recording(VLLMGenerator(llm, temperature=1.0, seed=7))
    budget = 6
    trajectories = run_rollouts(None, tokenizer, lambda: EchoEnvironment(turns=3), rows, generator=generator,
                                rollout_mode=mode, observation_role="user", max_turns=3, max_tokens_per_turn=budget,
                                max_completion_length=200, overlap_chunks=1)
    ends = [tokenizer.eos_token_id]
    observation_tokens = 0
    for t in trajectories:
        assert unsampled_trained(t, t.env_mask, ends) == 0  # the mask audit
        assert t.num_turns >= 2 or t.completion_ids[-1] in ends
        for turn, ((start, stop), generated) in enumerate(zip(t.turn_spans, t.generated_ids)):
            ids = t.completion_ids[start:stop]
            assert 1 <= len(ids) <= budget and set(t.env_mask[start:stop]) == {1}
            assert ids == generated[: len(ids)]
            # one batched call per turn: this turn's ids and log-probs are one of that call's vLLM outputs
            outputs = generator.outputs[turn]
            assert (ids, t.logprobs[start:stop]) in [(got[: len(ids)], lps[: len(ids)]) for got, lps in outputs]
        observation_tokens += len(t.env_mask) - sum(t.env_mask)
        assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.env_mask) if m == 0)
    assert observation_tokens > 0  # observations were appended, and masked

