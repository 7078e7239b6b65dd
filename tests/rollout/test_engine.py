"""The rollout engine: token exactness, masks, budgets, stop strings, failures, multi-rank call alignment."""

import pytest
from helpers import EchoEnvironment, ScriptedGenerator

from trl_agentic import RolloutConfig, run_rollouts
from trl_agentic.rollout.engine import RolloutEngine
from trl_agentic.rollout.generation import cut_at_stop
from trl_agentic.toy import LookupEnvironment, make_lookup_dataset


def _check_exact(t, tokenizer):
    """Invariant 1: agent segments are exactly the sampled ids and decode to the recorded actions."""
    assert len(t.completion_ids) == len(t.env_mask) == len(t.logprobs)
    covered = [0] * len(t.completion_ids)
    for (start, end), action in zip(t.turn_spans, t.actions):
        assert all(m == 1 for m in t.env_mask[start:end])
        assert tokenizer.decode(t.completion_ids[start:end], skip_special_tokens=True) == action
        for k in range(start, end):
            covered[k] = 1
    assert covered == t.env_mask  # mask 1 exactly on sampled positions


def test_real_model_rollout_is_token_exact(tiny_model, tokenizer):
    rows = make_lookup_dataset(6)
    trajs = run_rollouts(tiny_model, tokenizer, LookupEnvironment, rows, max_turns=3, max_tokens_per_turn=16,
                         max_completion_length=200)
    assert len(trajs) == 6
    for t, row in zip(trajs, rows):
        _check_exact(t, tokenizer)
        assert t.prompt_ids == tokenizer(row["prompt"])["input_ids"]
        assert all(lp < 0 for lp, m in zip(t.logprobs, t.env_mask) if m)  # sampling log-probs recorded
        assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.env_mask) if not m)


def _script_lookup(tokenizer):
    def script(ids):
        text = tokenizer.decode(ids)
        return "<answer>7</answer>" if "<result>" in text else "go <lookup>k1</lookup>"
    return script


def test_multi_turn_text_mode_appends_observation_ids(tokenizer):
    gen = ScriptedGenerator(tokenizer, _script_lookup(tokenizer))
    engine = RolloutEngine(gen, tokenizer, LookupEnvironment, RolloutConfig(max_turns=4, max_completion_length=100))
    [t] = engine.run(["find key k1\n"], [{"key": "k1", "value": "7"}])
    assert t.actions == ["go <lookup>k1</lookup>", "<answer>7</answer>"]
    assert t.stop_reason == "terminated" and not t.truncated and t.num_turns == 2
    start, end = t.turn_spans[0][1], t.turn_spans[1][0]
    assert t.completion_ids[start:end] == tokenizer("<result>7</result>", add_special_tokens=False)["input_ids"]
    assert t.env_mask[start:end] == [0] * (end - start)
    assert t.observations[0] == "<result>7</result>"
    assert gen.calls[0]["stop"] == ["</lookup>", "</answer>"]
    _check_exact(t, tokenizer)


def test_stop_string_cuts_overshoot(tokenizer):
    gen = ScriptedGenerator(tokenizer, _script_lookup(tokenizer), extra_after_stop=" and more text after")
    engine = RolloutEngine(gen, tokenizer, LookupEnvironment, RolloutConfig(max_completion_length=100))
    [t] = engine.run(["find key k1\n"], [{"key": "k1", "value": "7"}])
    assert t.actions[0].endswith("</lookup>") and t.actions[1].endswith("</answer>")


def test_cut_at_stop_prefers_first_of_eos_and_stop(tokenizer):
    ids = tokenizer("ab</answer>cd", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    end, reason = cut_at_stop(ids, tokenizer.decode, ["</answer>"], [tokenizer.eos_token_id])
    assert reason == "stop" and tokenizer.decode(ids[:end]) == "ab</answer>"
    end, reason = cut_at_stop(ids, tokenizer.decode, [], [tokenizer.eos_token_id])
    assert reason == "eos" and end == len(ids)
    assert cut_at_stop(ids[:2], tokenizer.decode, ["zzz"], []) == (2, None)


def test_turn_rewards_and_max_turns(tokenizer):
    gen = ScriptedGenerator(tokenizer, lambda ids: "act")
    engine = RolloutEngine(gen, tokenizer, lambda: EchoEnvironment(turns=10), RolloutConfig(max_turns=3))
    [t] = engine.run(["p"], [{}])
    assert t.num_turns == 3 and t.turn_rewards == [1.0, 2.0, 3.0]
    assert t.truncated and t.stop_reason == "max_turns" and t.env_reward == 6.0
    assert len(gen.calls) == 3


def test_total_token_budget_truncates(tokenizer):
    gen = ScriptedGenerator(tokenizer, lambda ids: "a b c d e f g h")
    cfg = RolloutConfig(max_turns=10, max_tokens_per_turn=8, max_completion_length=20)
    [t] = RolloutEngine(gen, tokenizer, lambda: EchoEnvironment(turns=10), cfg).run(["p"], [{}])
    assert t.truncated and t.stop_reason == "max_tokens"
    assert len(t.completion_ids) <= 20


def test_per_turn_budget_caps_each_turn(tokenizer):
    gen = ScriptedGenerator(tokenizer, lambda ids: " ".join(["word"] * 50))
    cfg = RolloutConfig(max_turns=2, max_tokens_per_turn=5, max_completion_length=100)
    [t] = RolloutEngine(gen, tokenizer, lambda: EchoEnvironment(turns=2), cfg).run(["p"], [{}])
    assert [end - start for start, end in t.turn_spans] == [5, 5]
    assert all(c["max_new_tokens"] == 5 for c in gen.calls)


@pytest.mark.parametrize("fail,reason", [("reset", "env_error"), ("step", "env_error"), ("hang", "env_timeout")])
def test_failing_environment_costs_one_trajectory(tokenizer, fail, reason):
    gen = ScriptedGenerator(tokenizer, lambda ids: "act")
    cfg = RolloutConfig(max_turns=3, env_timeout=0.3)
    trajs = RolloutEngine(gen, tokenizer, lambda: EchoEnvironment(turns=2), cfg).run(
        ["p", "q"], [{"fail": fail}, {}]
    )
    bad, good = trajs
    assert bad.stop_reason == reason and bad.truncated and bad.events[reason] == 1
    assert good.stop_reason == "terminated" and good.num_turns == 2


def test_flooding_observation_is_capped(tokenizer):
    gen = ScriptedGenerator(tokenizer, lambda ids: "act")
    cfg = RolloutConfig(max_turns=2, max_observation_tokens=50, max_completion_length=500)
    [t] = RolloutEngine(gen, tokenizer, lambda: EchoEnvironment(turns=2), cfg).run(["p"], [{"fail": "flood"}])
    assert t.events["observation_truncated"] == 1
    assert t.num_observation_tokens <= 50


def test_ranks_make_the_same_number_of_generation_calls(tokenizer):
    """A rank whose trajectories are done keeps calling generate (with a dummy) while another rank is active."""
    gen = ScriptedGenerator(tokenizer, lambda ids: "act")
    other_rank_turns = 4
    state = {"calls": 0}

    def sync_any(local_active: bool) -> bool:  # stands in for an all-reduce across 2 ranks
        state["calls"] += 1
        return local_active or state["calls"] <= other_rank_turns

    engine = RolloutEngine(gen, tokenizer, lambda: EchoEnvironment(turns=1), RolloutConfig(max_turns=5), sync_any)
    [t] = engine.run(["p"], [{}])
    assert t.num_turns == 1
    assert engine.generation_calls == other_rank_turns == len(gen.calls)
    assert [c["batch"] for c in gen.calls] == [1, 1, 1, 1]


def test_chat_mode_appends_message_delta(tokenizer):
    gen = ScriptedGenerator(tokenizer, lambda ids: "act" + tokenizer.eos_token)
    cfg = RolloutConfig(rollout_mode="chat", max_turns=2, max_completion_length=200)
    [t] = RolloutEngine(gen, tokenizer, lambda: EchoEnvironment(turns=2), cfg).run(
        [[{"role": "user", "content": "hi"}]], [{}]
    )
    text = tokenizer.decode(t.completion_ids)
    assert text == "act<|im_end|>\n<|im_start|>tool\n<result>1</result><|im_end|>\n<|im_start|>assistant\nact<|im_end|>"
    assert t.observations == ["<result>1</result>", None]  # the message content, for reward functions
    _check_exact(t, tokenizer)


def test_chat_mode_closes_turn_ended_by_stop_string(tokenizer):
    gen = ScriptedGenerator(tokenizer, _script_lookup(tokenizer))
    cfg = RolloutConfig(rollout_mode="chat", max_turns=3, max_completion_length=200)
    [t] = RolloutEngine(gen, tokenizer, LookupEnvironment, cfg).run([[{"role": "user", "content": "k1?"}]],
                                                                   [{"key": "k1", "value": "7"}])
    start = t.turn_spans[0][1]
    assert t.completion_ids[start] == tokenizer.eos_token_id and t.env_mask[start] == 0


def test_chat_template_that_is_not_prefix_preserving_is_refused(tokenizer):
    import copy

    from trl_agentic.rollout.observations import TemplateNotPrefixPreservingError

    bad = copy.deepcopy(tokenizer)
    bad.chat_template = "{{ messages|length }}" + tokenizer.chat_template
    gen = ScriptedGenerator(bad, lambda ids: "act" + bad.eos_token)
    with pytest.raises(TemplateNotPrefixPreservingError, match="prefix-preserving"):  # refused before any rollout
        RolloutEngine(gen, bad, lambda: EchoEnvironment(turns=2), RolloutConfig(rollout_mode="chat"))


def test_async_environment(tokenizer):
    class AsyncEnv(EchoEnvironment):
        async def step(self, action):
            return super().step(action)

    gen = ScriptedGenerator(tokenizer, lambda ids: "act")
    [t] = RolloutEngine(gen, tokenizer, lambda: AsyncEnv(turns=2), RolloutConfig()).run(["p"], [{}])
    assert t.stop_reason == "terminated" and t.turn_rewards == [1.0, 2.0]


def test_environment_steps_of_a_turn_run_concurrently(tokenizer):
    import time

    class SlowEnv(EchoEnvironment):
        def step(self, action):
            time.sleep(0.3)
            return super().step(action)

    gen = ScriptedGenerator(tokenizer, lambda ids: "act")
    start = time.perf_counter()
    RolloutEngine(gen, tokenizer, lambda: SlowEnv(turns=1), RolloutConfig()).run(["p"] * 8, [{}] * 8)
    assert time.perf_counter() - start < 8 * 0.3 / 2  # sequential would take 2.4 s


def test_overlap_chunks_run_tools_while_the_next_chunk_generates(tokenizer):
    """With two chunks, chunk 1's tool calls run while chunk 2 generates: a turn costs about max(generation, tools)
    instead of their sum; one chunk keeps the strict order (and one generation call per turn)."""
    import time

    class SlowGen(ScriptedGenerator):
        def generate(self, prompts, *args):
            time.sleep(0.3)
            return super().generate(prompts, *args)

    class SlowTool(EchoEnvironment):
        def step(self, action):
            time.sleep(0.3)
            return super().step(action)

    def run(chunks):
        gen = SlowGen(tokenizer, lambda ids: "act")
        engine = RolloutEngine(gen, tokenizer, lambda: SlowTool(turns=3), RolloutConfig(max_turns=3, overlap_chunks=chunks))
        start = time.perf_counter()
        trajectories = engine.run(["p"] * 4, [{}] * 4)
        return time.perf_counter() - start, gen.calls, trajectories

    sequential, calls_1, t1 = run(1)
    overlapped, calls_2, t2 = run(2)
    assert [c["batch"] for c in calls_1] == [4, 4, 4]
    assert [c["batch"] for c in calls_2] == [2, 2, 2, 2, 2, 2]
    assert [t.actions for t in t1] == [t.actions for t in t2] and all(t.stop_reason == "terminated" for t in t2)
    # sequential: 3 x (0.3 + 0.3) = 1.8 s; overlapped: ~6 x 0.3 + 0.3 = 2.1 s of generation calls would be slower if
    # tools did not overlap (6 x 0.3 + 3 x 0.3 = 2.7 s)
    assert overlapped < 2.5


def test_auto_overlap_splits_only_when_tools_are_slow(tokenizer):
    import time

    class SlowTool(EchoEnvironment):
        delay = 0.0

        def step(self, action):
            time.sleep(self.delay)
            return super().step(action)

    for delay, expected in ((0.0, [4, 4, 4]), (0.2, [4, 2, 2, 2, 2])):
        gen = ScriptedGenerator(tokenizer, lambda ids: "act")
        env = type("Env", (SlowTool,), {"delay": delay})
        RolloutEngine(gen, tokenizer, lambda: env(turns=3), RolloutConfig(max_turns=3)).run(["p"] * 4, [{}] * 4)
        assert [c["batch"] for c in gen.calls] == expected, delay


def test_generation_after_training_sees_its_context(tiny_model, tokenizer):
    """A model left in train mode with gradient checkpointing on (as SFTTrainer leaves it): transformers' generate
    then drops its KV cache but feeds one token per step. run_rollouts generates in eval mode without checkpointing,
    and restores both."""
    from transformers import GenerationConfig

    rows = make_lookup_dataset(4)
    config = GenerationConfig(do_sample=False, max_new_tokens=8, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)
    kwargs = dict(generation_config=config, max_turns=2, max_tokens_per_turn=8, max_completion_length=40)
    reference = run_rollouts(tiny_model.eval(), tokenizer, LookupEnvironment, rows, **kwargs)
    tiny_model.gradient_checkpointing_enable()
    tiny_model.train()
    after = run_rollouts(tiny_model, tokenizer, LookupEnvironment, rows, **kwargs)
    # a random tiny model predicts almost the same token whatever it sees, so compare what it scored, not the ids
    for a, r in zip(after, reference):
        assert a.completion_ids == r.completion_ids
        assert a.logprobs == pytest.approx(r.logprobs, abs=1e-5)
    assert tiny_model.training and tiny_model.is_gradient_checkpointing  # restored
