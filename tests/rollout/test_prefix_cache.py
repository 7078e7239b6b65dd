"""The KV cache kept across turns (rollout/prefix_cache.py): each turn prefills only its new ids, and the rollout is
the one the re-prefilling path gives: the same ids, log-probs within float32 summation noise, for every model family
of tests/conventions.py (Qwen2.5 instruct and base, Qwen3, Llama 3.2 with and without pad = eos, Gemma 3 with its
sliding-window layers), text and chat, greedy and sampled, on a LoRA model, with rows of different lengths and
trajectories that leave the batch early."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from conventions import CONVENTIONS, build_convention

from trl_agentic import Environment, RolloutConfig, StepResult, run_rollouts
from trl_agentic.rollout.generation import HFGenerator
from trl_agentic.rollout.prefix_cache import PrefixCache, unsupported_reason


class VaryingEnvironment(Environment):
    """Observations whose length depends on the row and the turn; the row's ``turns`` ends it (rows end at
    different turns, so trajectories leave the batch early)."""

    def reset(self, **row):
        self.n, self.turns, self.k = 0, row["turns"], row["k"]

    def step(self, action: str) -> StepResult:
        self.n += 1
        observation = "<result>" + " ".join(f"v{self.k * self.n + j}" for j in range(self.k + self.n)) + "</result>"
        return StepResult(observation=observation, reward=0.0, terminated=self.n >= self.turns)


def _rows(mode: str, n: int = 6) -> list[dict]:
    rows = []
    for i in range(n):
        text = "find key " + " ".join(f"k{j}" for j in range(1 + 3 * (i % 3)))  # prompts of different lengths
        prompt = [{"role": "user", "content": text}] if mode == "chat" else text + "\n"
        rows.append({"prompt": prompt, "turns": 2 + i % 3, "k": 1 + i % 4})
    return rows


def _generators(model, tokenizer, do_sample: bool):
    config = copy.deepcopy(model.generation_config)
    config.do_sample = do_sample
    if do_sample:
        config.temperature, config.top_p, config.top_k = 1.0, 1.0, 0
    cached = HFGenerator(model, tokenizer, config, return_logprobs=True)
    plain = HFGenerator(model, tokenizer, config, return_logprobs=True, keep_cache=False)
    return cached, plain


def _rollouts(model, tokenizer, generator, rows, config, seed=0):
    torch.manual_seed(seed)
    return run_rollouts(model, tokenizer, VaryingEnvironment, rows, config=config, generator=generator,
                        generation_config=generator.generation_config)


def _assert_same(cached, plain):
    for a, b in zip(cached, plain, strict=True):
        assert a.prompt_ids == b.prompt_ids
        assert a.completion_ids == b.completion_ids
        assert a.env_mask == b.env_mask
        assert a.stop_reason == b.stop_reason
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)


def _config(conv, mode):
    return RolloutConfig(rollout_mode=mode, observation_role=conv.observation_role, max_turns=4,
                         max_tokens_per_turn=6, max_completion_length=300)


@pytest.mark.parametrize("mode", ("text", "chat"))
@pytest.mark.parametrize("name", CONVENTIONS)
def test_cached_rollout_equals_reprefilled(name, mode):
    conv = build_convention(name)
    model = conv.load_model().float()
    cached, plain = _generators(model, conv.tokenizer, do_sample=False)
    rows = _rows(mode)
    config = _config(conv, mode)
    with_cache = _rollouts(model, conv.tokenizer, cached, rows, config)
    without = _rollouts(model, conv.tokenizer, plain, rows, config)
    _assert_same(with_cache, without)
    assert max(t.num_turns for t in with_cache) >= 3
    # the same prompts went in; the cached generator computed only what the cache did not hold, and what the rows
    # share once
    assert cached.prefilled_tokens - cached.shared_tokens + cached.reused_tokens == plain.prefilled_tokens
    assert plain.reused_tokens == plain.shared_tokens == 0
    assert cached.reused_tokens > cached.prefilled_tokens


def test_sampled_rollout_equals_reprefilled():
    conv = build_convention("qwen2.5-instruct")
    model = conv.load_model().float()
    cached, plain = _generators(model, conv.tokenizer, do_sample=True)
    rows = _rows("chat") * 2  # GRPO-like: several samples of each prompt share its cache prefix
    config = _config(conv, "chat")
    _assert_same(_rollouts(model, conv.tokenizer, cached, rows, config, seed=3),
                 _rollouts(model, conv.tokenizer, plain, rows, config, seed=3))


def test_each_turn_prefills_only_its_new_ids():
    """One trajectory: turn 1 prefills the prompt; every later turn the previous turn's last sampled id (never fed
    to the model) and the observation."""
    conv = build_convention("llama-3.2-instruct")
    model = conv.load_model().float()
    cached, _ = _generators(model, conv.tokenizer, do_sample=False)
    [t] = _rollouts(model, conv.tokenizer, cached, [_rows("text")[2]], _config(conv, "text"))
    observation_ids = [t.turn_spans[k + 1][0] - t.turn_spans[k][1] for k in range(t.num_turns - 1)]
    assert t.num_turns == 4 and all(n > 0 for n in observation_ids)
    assert cached.prefilled_tokens == len(t.prompt_ids) + sum(1 + n for n in observation_ids)


@pytest.mark.parametrize("name", CONVENTIONS)
def test_rows_prefill_what_they_share_once(name):
    """A batch whose prompts share a long system prompt, two of them twice (a GRPO group): the common prefix is
    prefilled once, then each repeated prompt once, and every row reuses them; the ids and log-probs are those of the
    re-prefilling path."""
    conv = build_convention(name)
    model = conv.load_model().float()
    cached, plain = _generators(model, conv.tokenizer, do_sample=False)
    system = conv.tokenizer(" ".join(f"rule {k}: answer with the key." for k in range(12)),
                            add_special_tokens=False)["input_ids"]
    questions = [conv.tokenizer(f" find key k{k}", add_special_tokens=False)["input_ids"] for k in (1, 2, 3)]
    assert len({len(q) for q in questions}) == 1  # rows of one width: no row recomputes a shared id
    prompts = [system + questions[0], system + questions[1], system + questions[1], system + questions[2],
               system + questions[2]]
    with cached.session():
        got = cached.generate(prompts, 5, [], conv.eos_token_ids)
    want = plain.generate(prompts, 5, [], conv.eos_token_ids)
    assert [g.ids for g in got] == [w.ids for w in want]
    torch.testing.assert_close(torch.tensor([g.logprobs for g in got]), torch.tensor([w.logprobs for w in want]),
                               atol=1e-5, rtol=0)
    shortest = min(len(p) for p in prompts)
    common = next(k for k in range(shortest) if len({tuple(p[: k + 1]) for p in prompts}) > 1)
    grouped = sum(len(system + q) - 1 - common for q in questions[1:])
    assert cached.shared_tokens == common + grouped
    total = sum(len(p) for p in prompts)
    assert cached.prefilled_tokens - cached.shared_tokens + cached.reused_tokens == total
    # each row computes only what no other row shares: the single prompt its tail, the repeated ones their last id
    assert cached.prefilled_tokens - cached.shared_tokens == len(system + questions[0]) - common + 4


def _distinct_prefixes(sequences) -> int:
    """How many distinct prefixes ``sequences`` have: the positions a store holding each shared position once holds."""
    return len({tuple(seq[: k + 1]) for seq in sequences for k in range(len(seq))})


def _system_prompt(tokenizer, rules: int = 24) -> list[int]:
    return tokenizer(" ".join(f"rule {k}: answer with the key." for k in range(rules)), add_special_tokens=False)[
        "input_ids"]


@pytest.mark.parametrize("name", CONVENTIONS)
def test_a_prompt_shared_across_calls_is_prefilled_and_held_once(name):
    """Trajectories that share a long system prompt reach the generator in different calls (agents whose first
    requests come apart: one, then two more), then all their next turns in one call: the system prompt is prefilled
    once and held once (a radix tree of the kept sequences: each shared position once, not once per trajectory), each
    kept sequence is a trajectory's, and the ids and log-probs are those of the re-prefilling path, also for rows
    whose reused keys and values were split off another trajectory's."""
    conv = build_convention(name)
    model = conv.load_model().float()
    cached, plain = _generators(model, conv.tokenizer, do_sample=False)
    system = _system_prompt(conv.tokenizer)
    questions = [conv.tokenizer(f" find key k{k}", add_special_tokens=False)["input_ids"] for k in (1, 2, 3)]
    observation = conv.tokenizer(" the value is 7.", add_special_tokens=False)["input_ids"]
    eos = conv.eos_token_ids

    def rollout(generator):
        first = generator.generate([system + questions[0]], 5, [], eos)
        first += generator.generate([system + q for q in questions[1:]], 5, [], eos)
        turns = [system + q + g.ids + observation for q, g in zip(questions, first)]
        return first, turns, generator.generate(turns, 5, [], eos)

    with cached.session():
        got = rollout(cached)
        cache: PrefixCache = cached._prefix_cache
        kept, held = cache.sequences(), cache.held_tokens
    want = rollout(plain)
    for got_call, want_call in zip((got[0], got[2]), (want[0], want[2])):
        assert [g.ids for g in got_call] == [w.ids for w in want_call]
        for g, w in zip(got_call, want_call):
            torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-5, rtol=0)
    turns = got[1]
    assert plain.prefilled_tokens == sum(len(system + q) for q in questions) + sum(len(t) for t in turns)
    assert cached.prefilled_tokens - cached.shared_tokens + cached.reused_tokens == plain.prefilled_tokens
    # the system prompt once: every later row computes its question, then its last sampled id and the observation
    # (a row computes as many columns as the widest row of its call)
    widest = max(len(q) for q in questions)
    assert cached.prefilled_tokens <= len(system) + len(questions[0]) + 2 * widest + 3 * (2 + len(observation))
    assert len(kept) == 3 and all(any(k[: len(t)] == t for t in turns) for k in kept)
    assert held == _distinct_prefixes(kept) == cached.peak_cached_tokens
    assert held <= sum(len(k) for k in kept) - 2 * len(system)


def test_a_bounded_cache_drops_the_least_recently_used_and_stays_exact():
    """``max_cached_tokens``: past the bound the least recently used leaf goes (the trajectory not continued), the
    prefix its sibling shares stays; a row whose positions were dropped prefills them again, exactly."""
    conv = build_convention("qwen2.5-instruct")
    model = conv.load_model().float()
    cached, plain = _generators(model, conv.tokenizer, do_sample=False)
    system = _system_prompt(conv.tokenizer, rules=8)
    one, two = (system + conv.tokenizer(f" find key k{k}", add_special_tokens=False)["input_ids"] for k in (1, 2))
    eos = conv.eos_token_ids
    seen = []

    def rollout(generator):
        outputs = [generator.generate([one], 4, [], eos)[0]]
        outputs.append(generator.generate([two], 4, [], eos)[0])
        if generator is cached:
            seen.append((cached._prefix_cache.sequences(), cached._prefix_cache.held_tokens))
        outputs.append(generator.generate([two + outputs[1].ids + [eos[0]]], 4, [], eos)[0])
        outputs.append(generator.generate([one + outputs[0].ids + [eos[0]]], 4, [], eos)[0])
        return outputs

    want = rollout(plain)
    first, second = (len(want[k].ids) - 1 for k in (0, 1))  # the ids fed back (the last sampled one is not)
    common = next(k for k in range(len(one)) if one[k] != two[k])
    cached.max_cached_tokens = len(one) + first + len(two) - common + second - 1  # both first turns but one position
    with cached.session():
        got = rollout(cached)
    for g, w in zip(got, want, strict=True):
        assert g.ids == w.ids
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-5, rtol=0)
    # the first trajectory's own positions went; the head the second one reused, and the second one, stay
    assert seen == [([two + want[1].ids[:-1]], len(two) + second)]
    assert cached.peak_cached_tokens <= cached.max_cached_tokens < len(one) + first + len(two) + second
    # reused: the head (second call), the second trajectory's whole first turn (third), only the head (fourth)
    assert cached.reused_tokens == common + (len(two) + second) + common


@pytest.mark.parametrize("bound", [-1, 2.5, True, "1000"])
def test_a_bound_that_is_not_a_number_of_positions_is_refused_in_one_line(bound):
    conv = build_convention("qwen2.5-instruct")
    with pytest.raises(ValueError) as refused:
        HFGenerator(conv.load_model(), conv.tokenizer, max_cached_tokens=bound)
    assert "pass a number of positions >= 0" in str(refused.value) and "\n" not in str(refused.value)


def test_a_bound_of_zero_keeps_nothing_and_stays_exact():
    conv = build_convention("qwen2.5-instruct")
    model = conv.load_model().float()
    cached, plain = _generators(model, conv.tokenizer, do_sample=False)
    cached.max_cached_tokens = 0
    rows, config = _rows("chat"), _config(conv, "chat")
    _assert_same(_rollouts(model, conv.tokenizer, cached, rows, config),
                 _rollouts(model, conv.tokenizer, plain, rows, config))
    assert cached.peak_cached_tokens == 0


def test_agents_whose_first_requests_come_apart_prefill_their_shared_prompt_once():
    """Agents through the endpoint sending one long system prompt and tool schemas (as coding CLIs do), each agent's
    first request held back until the one before it was answered, so that each lands in a later ``generate`` call
    (CLI processes start at different times): the shared prompt is prefilled once and held once for the three, and
    the trajectories are those of the re-prefilling path."""
    import asyncio
    import json

    from helpers import native_call, scripted

    from trl_agentic.agents import AgentRollout

    conv = build_convention("qwen2.5-instruct")
    tok = conv.load_tokenizer()
    model = scripted(conv.load_model().float(), tok, [native_call("add", a=2, b=3), "5"])
    system = " ".join(f"rule {k}: answer with the key." for k in range(24))
    tools = [{"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]}}}]
    answered: list[asyncio.Event] = []

    async def agent(client, i, **row):
        if i:
            await answered[i - 1].wait()
        messages = [{"role": "system", "content": system}, {"role": "user", "content": f"What is {i} plus 3?"}]
        while True:
            reply = await client.chat.completions.create(model="p", messages=messages, tools=tools)
            answered[i].set()
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return message.content
            for call in message.tool_calls:
                arguments = json.loads(call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": str(sum(arguments.values()))})

    class Counting(HFGenerator):
        def generate(self, prompts, *args):
            self.sizes.append(len(prompts))
            return super().generate(prompts, *args)

    config = copy.deepcopy(model.generation_config)
    config.do_sample = False
    rollout = AgentRollout(agent, tok, RolloutConfig(max_turns=3, max_tokens_per_turn=48, max_completion_length=256,
                                                     env_timeout=60.0), [tok.convert_tokens_to_ids("<|im_end|>")])
    runs = {}
    for keep in (True, False):
        generator = Counting(model, tok, config, keep_cache=keep)
        generator.sizes = []
        answered[:] = [asyncio.Event() for _ in range(3)]
        runs[keep] = (rollout.run([{"i": i} for i in range(3)], generator), generator)
    rollout.close()
    (cached, with_cache), (plain, without) = runs[True], runs[False]
    for a, b in zip(cached, plain, strict=True):
        assert (a.prompt_ids, a.completion_ids, a.env_mask) == (b.prompt_ids, b.completion_ids, b.env_mask)
        assert a.num_turns == 2 and a.stop_reason == "terminated"
    assert with_cache.sizes[0] == 1 and len(with_cache.sizes) >= 3  # the first requests came apart
    conversations = [t.prompt_ids + t.completion_ids for t in cached]
    shared = next(k for k in range(len(conversations[0])) if len({tuple(c[: k + 1]) for c in conversations}) > 1)
    assert shared > 300
    assert with_cache.prefilled_tokens - with_cache.shared_tokens + with_cache.reused_tokens \
        == without.prefilled_tokens
    assert with_cache.prefilled_tokens < 2 * shared < without.prefilled_tokens / 3  # the shared prompt once, not 3x
    assert with_cache.peak_cached_tokens <= _distinct_prefixes(conversations) \
        <= sum(map(len, conversations)) - 2 * shared


def test_lora_model_equals_reprefilled():
    from peft import LoraConfig, get_peft_model

    conv = build_convention("qwen2.5-instruct")
    torch.manual_seed(0)
    model = get_peft_model(conv.load_model().float(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                                 init_lora_weights=False))
    cached, plain = _generators(model, conv.tokenizer, do_sample=False)
    rows, config = _rows("chat"), _config(conv, "chat")
    _assert_same(_rollouts(model, conv.tokenizer, cached, rows, config),
                 _rollouts(model, conv.tokenizer, plain, rows, config))
    assert cached.reused_tokens > 0


def test_cache_lives_only_inside_a_session():
    """Outside a session nothing is kept; a session's cache is gone when it ends (the weights may change between
    rollouts), so the next rollout's first turn prefills everything again."""
    conv = build_convention("qwen2.5-instruct")
    model = conv.load_model().float()
    cached, _ = _generators(model, conv.tokenizer, do_sample=False)
    prompt = conv.tokenizer("find key k1", add_special_tokens=False)["input_ids"]
    first = cached.generate([prompt], 4, [], conv.eos_token_ids)[0].ids
    cached.generate([prompt + first + prompt], 4, [], conv.eos_token_ids)
    assert cached.reused_tokens == 0
    with cached.session():
        first = cached.generate([prompt], 4, [], conv.eos_token_ids)[0].ids
        cached.generate([prompt + first + prompt], 4, [], conv.eos_token_ids)
        assert cached.reused_tokens == len(prompt) + len(first) - 1
    reused = cached.reused_tokens
    with cached.session():
        cached.generate([prompt + first + prompt], 4, [], conv.eos_token_ids)
    assert cached.reused_tokens == reused


def test_a_model_that_cannot_keep_the_cache_re_prefills_and_says_why_once(caplog):
    """A static cache (generation_config.cache_implementation) cannot be extended: one warning, then the rollout is
    exactly the re-prefilling one."""
    conv = build_convention("qwen2.5-instruct")
    model = conv.load_model().float()
    cached, plain = _generators(model, conv.tokenizer, do_sample=False)
    cached.generation_config.cache_implementation = "static"
    plain.generation_config.cache_implementation = "static"
    rows, config = _rows("text"), _config(conv, "text")
    with caplog.at_level(logging.WARNING, logger="trl_agentic.rollout.generation"):
        with_cache = _rollouts(model, conv.tokenizer, cached, rows, config)
        _rollouts(model, conv.tokenizer, cached, rows, config)
    _assert_same(with_cache, _rollouts(model, conv.tokenizer, plain, rows, config))
    warnings = [r.getMessage() for r in caplog.records if "not kept across turns" in r.getMessage()]
    assert len(warnings) == 1 and "cache_implementation='static'" in warnings[0]
    assert cached.reused_tokens == 0


def test_unsupported_layer_types_are_named():
    class Config:
        is_encoder_decoder = False
        layer_types = ["full_attention", "linear_attention"]

    class Model:
        config = Config()

    assert "linear_attention" in unsupported_reason(Model(), None)
    Config.layer_types = ["sliding_attention", "full_attention"]
    assert unsupported_reason(Model(), None) is None


def test_longest_common_prefix_wins_and_rewritten_history_reuses_what_it_shares():
    """Entries are matched by longest common prefix: the trajectory's own last turn, not a sibling that shares only
    the prompt; a rewritten history (an agent that edits its conversation) reuses only the unchanged head."""
    conv = build_convention("qwen2.5-instruct")
    model = conv.load_model().float()
    cached, _ = _generators(model, conv.tokenizer, do_sample=False)
    eos = conv.eos_token_ids
    with cached.session():
        cache: PrefixCache = cached._prefix_cache
        a, b = [5, 6, 7, 8, 9, 10], [5, 6, 7, 20, 21, 22]
        outputs = cached.generate([a, b], 3, [], eos)
        assert cache.sequences() == sorted([a + outputs[0].ids[:2], b + outputs[1].ids[:2]])  # fed ids only
        assert cache.held_tokens == 3 + 2 * (3 + 2)  # the shared head [5, 6, 7] once
        before = cached.reused_tokens
        cached.generate([b + outputs[1].ids + [30]], 3, [], eos)
        assert cached.reused_tokens - before == len(b) + len(outputs[1].ids) - 1
        before = cached.reused_tokens
        cached.generate([[5, 6, 7, 40, 41]], 3, [], eos)
        assert cached.reused_tokens - before == 3


@pytest.mark.parametrize("kind", ["grpo", "ppo"])
def test_trainers_keep_the_cache_and_train_as_without(tiny_model_dir, tokenizer, tmp_path, kind):
    """Both trainers roll out through the cache by default (``prefix_caching``), with LoRA and gradient
    checkpointing on, and train exactly as with every turn re-prefilled (``prefix_caching=False``)."""
    from helpers import agentic_args, lookup_dataset, ppo_args
    from peft import LoraConfig

    from trl_agentic import AgenticGRPOTrainer, AgenticPPOTrainer
    from trl_agentic.toy import LookupEnvironment, lookup_reward

    trainer_class, make_args = (AgenticGRPOTrainer, agentic_args) if kind == "grpo" else (AgenticPPOTrainer, ppo_args)
    runs = {}
    for caching in (True, False):
        args = make_args(tmp_path / str(caching), prefix_caching=caching, gradient_checkpointing=True, seed=0)
        trainer = trainer_class(model=tiny_model_dir, reward_funcs=lookup_reward, args=args,
                                train_dataset=lookup_dataset(8), processing_class=tokenizer,
                                environment=LookupEnvironment,
                                peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
        trainer.train()
        logs = [r for r in trainer.state.log_history if "loss" in r]
        assert len(logs) == 2 and all(r["agentic/mask_audit"] == 0 for r in logs)
        runs[caching] = (logs, trainer.generator)
    (cached_logs, cached), (plain_logs, plain) = runs[True], runs[False]
    assert cached.reused_tokens > 0 and plain.reused_tokens == 0
    assert cached.prefilled_tokens - cached.shared_tokens + cached.reused_tokens == plain.prefilled_tokens
    for a, b in zip(cached_logs, plain_logs):
        assert a["agentic/turns_mean"] == b["agentic/turns_mean"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)


def test_preallocated_layer_grows_and_survives_replaced_tensors():
    """A layer written past its capacity grows; one whose tensors a DynamicLayer method replaced (crop, batch
    selection) adopts them; what attention reads is always every position written, in order."""
    from trl_agentic.rollout.prefix_cache import PreallocatedLayer

    layer = PreallocatedLayer(capacity=3)
    chunks = [torch.randn(2, 1, n, 4) for n in (2, 1, 3)]
    for chunk in chunks:
        keys, values = layer.update(chunk, -chunk)
    torch.testing.assert_close(keys, torch.cat(chunks, dim=-2))
    torch.testing.assert_close(values, -torch.cat(chunks, dim=-2))
    layer.crop(-2)
    layer.batch_select_indices(torch.tensor([1]))
    extra = torch.randn(1, 1, 1, 4)
    keys, _ = layer.update(extra, extra)
    torch.testing.assert_close(keys, torch.cat([torch.cat(chunks, dim=-2)[1:, :, :4, :], extra], dim=-2))
    assert layer.get_seq_length() == 5


def test_tools_in_chat_template_kwargs_render_like_native_tools():
    """TRL's config field ``chat_template_kwargs`` may hold ``tools`` (the rollout benchmark puts the schema there):
    the prompt renders with them, as with an environment's native tools."""
    from transformers.utils import get_json_schema

    from trl_agentic.rollout.observations import ObservationEncoder

    def lookup(key: str) -> str:
        """Look up a key.

        Args:
            key: The key.
        """
        return key

    conv = build_convention("qwen2.5-instruct")
    schema = get_json_schema(lookup)
    prompt = [{"role": "user", "content": "find k1"}]
    from_kwargs = ObservationEncoder(conv.tokenizer, "chat", "tool", {"tools": [schema]}).encode_prompt(prompt)
    native = ObservationEncoder(conv.tokenizer, "chat", "tool").encode_prompt(prompt, tools=[schema])
    plain = ObservationEncoder(conv.tokenizer, "chat", "tool").encode_prompt(prompt)
    assert from_kwargs == native != plain


def test_max_cached_tokens_is_a_rollout_setting_every_generator_gets(tmp_path):
    """The bound of the kept cache is a rollout field (a trainer flag, an evaluate keyword): the trainer's generator
    is built with it, and a bound that is not a number of positions is refused with the config."""
    from datasets import Dataset

    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer
    from trl_agentic.toy import LookupEnvironment, build_tiny_model, build_tokenizer, lookup_reward, make_lookup_dataset

    tok = build_tokenizer()
    args = AgenticGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, max_steps=1,
                             max_completion_length=32, use_cpu=True, report_to="none", max_cached_tokens=64)
    trainer = AgenticGRPOTrainer(model=build_tiny_model(tok), processing_class=tok, reward_funcs=lookup_reward,
                                 args=args, train_dataset=Dataset.from_list(make_lookup_dataset(4)),
                                 environment=LookupEnvironment)
    assert trainer.generator.max_cached_tokens == 64
    with pytest.raises(ValueError, match="max_cached_tokens must be a number of positions >= 0 or None, got -1"):
        AgenticGRPOConfig(output_dir=str(tmp_path), max_cached_tokens=-1, use_cpu=True)
