"""HFGenerator: stop strings end a generation, and their criteria is built once per generator, not per call."""

import copy

import pytest

import trl_agentic.rollout.generation as generation
from trl_agentic.rollout.generation import HFGenerator


def test_stop_string_criteria_is_built_once_and_stops(tiny_model, tokenizer, monkeypatch):
    config = copy.deepcopy(tiny_model.generation_config)
    config.do_sample = False
    gen = HFGenerator(tiny_model, tokenizer, generation_config=config)
    prompt = tokenizer("find key k1", add_special_tokens=False)["input_ids"]
    [free] = gen.generate([prompt], 8, [], [tokenizer.eos_token_id])
    stop = tokenizer.decode(free.ids[:3])  # what the greedy continuation reaches at its third token
    assert stop and len(free.ids) == 8
    built = []
    real = generation.StopStringCriteria
    monkeypatch.setattr(generation, "StopStringCriteria", lambda tok, strings: built.append(strings) or real(tok, strings))
    for _ in range(3):
        [out] = gen.generate([prompt], 8, [stop], [tokenizer.eos_token_id])
        assert out.ids == free.ids[: len(out.ids)] and len(out.ids) <= 3
        assert tokenizer.decode(prompt + out.ids).endswith(stop)  # transformers matches the end of the sequence
    assert built == [[stop]]



@pytest.mark.parametrize("settings", [{}, {"temperature": 0.7}, {"temperature": 0.8, "top_k": 5, "top_p": 0.9},
                                      {"min_p": 0.05, "typical_p": 0.95, "epsilon_cutoff": 0.001}])
def test_sampled_logprobs_recorded_step_by_step_equal_those_of_every_steps_scores(tiny_model, tokenizer, settings,
                                                                                     monkeypatch):
    """Sampling, the recorder (SampledTokenLogprobs: the warpers rebuilt) gives the tokens and log-probs that keeping
    every step's scores gives (the same draws: it never changes the scores generate samples from)."""
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=True, **{"top_k": 0, **settings})
    prompts = [tokenizer.encode("<lookup>a</lookup>"), tokenizer.encode("b")]

    def sample():
        generator = HFGenerator(copy.deepcopy(tiny_model), tokenizer, config, return_logprobs=True, keep_cache=False)
        torch.manual_seed(0)
        return generator.generate(prompts, 12, [], [tokenizer.eos_token_id])

    recorded = sample()
    assert recorded[0].logprobs is not None
    monkeypatch.setattr(generation, "sampling_warpers", lambda config: None)  # every step's scores: the reference
    kept = sample()
    for a, b in zip(recorded, kept):
        assert a.ids == b.ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert any(len(g.ids) > 1 for g in recorded)
