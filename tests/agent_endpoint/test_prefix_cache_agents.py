"""The agent endpoint on transformers generation keeps each conversation's KV cache across its requests: a request
that extends the recorded conversation prefills only what is new (the tool message and the next assistant header),
and what is recorded is what the re-prefilling path records."""

from __future__ import annotations

import copy

from agent_helpers import call, scripted
from test_sessions import tool_loop

from trl_agentic.agents import AgentRollout
from trl_agentic.rollout.config import RolloutConfig
from trl_agentic.rollout.generation import HFGenerator


def test_each_request_prefills_only_what_extends_its_conversation(qwen):
    tok = qwen.load_tokenizer()
    model = scripted(qwen.load_model().float(), tok, [call("add", a=2, b=3), "5"])
    config = copy.deepcopy(model.generation_config)
    config.do_sample = False
    rollout = AgentRollout(tool_loop, tok, RolloutConfig(max_turns=4, max_tokens_per_turn=64,
                                                         max_completion_length=256, env_timeout=30.0),
                           [tok.convert_tokens_to_ids("<|im_end|>")])
    runs = {}
    for keep in (True, False):
        generator = HFGenerator(model, tok, config, keep_cache=keep)
        runs[keep] = (rollout.run([{}, {}], generator), generator)
    rollout.close()
    (cached, with_cache), (plain, without) = runs[True], runs[False]
    for a, b in zip(cached, plain, strict=True):
        assert (a.prompt_ids, a.completion_ids, a.env_mask) == (b.prompt_ids, b.completion_ids, b.env_mask)
        assert a.num_turns == 2 and len(a.segments) == 1
    t = cached[0]
    first_turn_end, second_start = t.turn_spans[0][1], t.turn_spans[1][0]
    delta = second_start - first_turn_end  # the tool message and the assistant header, appended by the endpoint
    assert without.prefilled_tokens == 2 * (2 * len(t.prompt_ids) + second_start)
    # the same prompt ids went in; with the cache each request prefills at most its first prompt, then the last
    # sampled id and the delta (less where the two agents' requests, batched together, share ids: once)
    assert with_cache.prefilled_tokens - with_cache.shared_tokens + with_cache.reused_tokens == without.prefilled_tokens
    assert with_cache.prefilled_tokens <= 2 * (len(t.prompt_ids) + 1 + delta)
