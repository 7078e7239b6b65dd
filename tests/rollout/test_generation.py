"""HFGenerator: stop strings end a generation, and their criteria is built once per generator, not per call."""

import copy

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
