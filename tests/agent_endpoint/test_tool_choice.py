"""``tool_choice="required"`` and a named function (hostile tests first: both answered 400 before): the turn opens
with the call the chat template writes, those ids are recorded masked, and the model samples the rest from the policy
given them, so the log-probs the trainer computes on the recorded sequence are the log-probs that sampled it."""

from __future__ import annotations

import json

import pytest
import torch
from agent_helpers import TOOLS
from helpers import ScriptedGenerator
from test_endpoint_hostile import rollout

from trl_agentic.agents import Agent
from trl_agentic.rollout.audit import sampled_positions
from trl_agentic.rollout.generation import Generation

NAMED = {"type": "function", "function": {"name": "add"}}


def continuing_script(tok):
    """A model that answers in text unless its turn was opened with a call, which it then completes."""
    def script(ids):
        text = tok.decode(ids)
        if text.endswith('"arguments":'):
            return ' {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
        if text.endswith('{"name": "'):
            return 'add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
        return "No tool needed.<|im_end|>"
    return script


async def ask(client, tool_choice):
    r = await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "2+3?"}], tools=TOOLS,
                                             tool_choice=tool_choice)
    calls = r.choices[0].message.tool_calls or []
    return r.choices[0].finish_reason, [(c.function.name, json.loads(c.function.arguments)) for c in calls], \
        r.choices[0].model_extra["token_ids"]


def test_required_and_named_choices_open_the_turn_with_a_call(qwen):
    async def agent(client, choice, **row):
        return await ask(client, choice)

    ro, tok, _ = rollout(qwen, agent)
    gen = ScriptedGenerator(tok, continuing_script(tok))
    auto, required, named = ro.run([{"choice": c} for c in ("auto", "required", NAMED)], gen)
    assert auto.agent_output[:2] == ("stop", [])
    openings = ['<tool_call>\n{"name": "', '<tool_call>\n{"name": "add", "arguments":']
    for t, opening in zip((required, named), openings):
        assert t.agent_output[:2] == ("tool_calls", [("add", {"a": 2, "b": 3})]), t.agent_output
        forced = len(tok(opening, add_special_tokens=False)["input_ids"])
        (start, end), = t.turn_spans
        assert start == forced and t.env_mask == [0] * forced + [1] * (end - start)
        assert tok.decode(t.completion_ids[:forced]) == opening
        assert t.agent_output[2] == t.completion_ids[start:end] == t.generated_ids[0][:end - start]
        assert all(sampled_positions(t, ro.eos_token_ids)[start:end])  # the mask audit allows every trained token
        assert t.events["forced_call"] == 1
    ro.close()


def test_unforced_when_asked(qwen):
    async def agent(client, **row):
        return await ask(client, "required")

    ro, tok, _ = rollout(qwen, Agent(agent, force_tool_choice=False))
    [t] = ro.run([{}], ScriptedGenerator(tok, continuing_script(tok)))
    assert t.agent_output[:2] == ("stop", []) and t.env_mask == [1] * len(t.completion_ids)  # the policy's own turn
    ro.close()


@pytest.mark.parametrize("family, required, named", [
    ("qwen2.5-instruct", '<tool_call>\n{"name": "', '<tool_call>\n{"name": "add", "arguments": '),
    ("qwen3", '<think>\n\n</think>\n\n<tool_call>\n{"name": "', '<think>\n\n</think>\n\n<tool_call>\n{"name": "add", "arguments": '),
    ("llama-3.2-instruct", '{"name": "', '{"name": "add", "parameters": '),
    ("gemma-3", None, None)])  # its template writes no call: served unforced
def test_call_openings_are_read_from_the_chat_template(family, required, named):
    """The opening's text, then its ids: the text up to the last token boundary inside it (the trailing space is
    the first character of the model's own ``' {"'``)."""
    from conventions import build_convention

    from trl_agentic.agents.forcing import opening_ids, opening_text
    from trl_agentic.rollout.observations import ObservationEncoder

    tok = build_convention(family).load_tokenizer()
    encoder = ObservationEncoder(tok, "chat", "user" if family == "gemma-3" else "tool", None, [tok.eos_token_id])
    assert (opening_text(encoder, TOOLS, ""), opening_text(encoder, TOOLS, "add")) == (required, named)
    ids = [opening_ids(encoder, TOOLS, name) for name in ("", "add")]
    assert [tok.decode(i) if i else None for i in ids] == [required, named and named.rstrip(" ")]


@pytest.mark.parametrize("choice, message", [
    ("required", "offers no tools"), ({"type": "function", "function": {"name": "mul"}}, "not among the tools"),
    ({"type": "function"}, "tool_choice must be")])
def test_bad_tool_choices_answer_400(qwen, choice, message):
    import openai

    async def agent(client, **row):
        tools = [] if choice == "required" else TOOLS
        try:
            await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}],
                                                 tools=tools or openai.omit, tool_choice=choice)
        except openai.BadRequestError as exc:
            return exc.body

    ro, tok, gen = rollout(qwen, agent)
    [t] = ro.run([{}], gen)
    assert message in t.agent_output["message"] and t.agent_output["param"] == "tool_choice"
    ro.close()


class Sampler:
    """Samples from a real model, token by token at temperature 1, and reports each sampled token's log-prob."""

    def __init__(self, model):
        self.model, self.rng = model, torch.Generator().manual_seed(0)

    @torch.no_grad()
    def generate(self, prompts, max_new_tokens, stop_strings, eos_token_ids):
        outputs = []
        for prompt in prompts:
            ids, new, logprobs = torch.tensor([prompt]), [], []
            for _ in range(max_new_tokens):
                logp = torch.log_softmax(self.model(ids).logits[0, -1].float(), -1)
                token = int(torch.multinomial(logp.exp(), 1, generator=self.rng))
                new.append(token)
                logprobs.append(float(logp[token]))
                ids = torch.cat([ids, torch.tensor([[token]])], 1)
                if token in eos_token_ids:
                    break
            outputs.append(Generation(new, logprobs))
        return outputs


def test_the_trained_log_probs_are_those_that_sampled_the_forced_turn(qwen):
    """The measurement behind the design: on the recorded sequence (prompt, forced opening masked, sampled tokens), a
    forward pass of the policy gives, at every trained position, the log-prob the token was sampled with."""
    torch.manual_seed(0)
    model = qwen.load_model().eval()

    async def agent(client, choice, **row):
        return await ask(client, choice)

    ro, tok, _ = rollout(qwen, agent, max_tokens_per_turn=12)
    runs = ro.run([{"choice": "required"}, {"choice": NAMED}], Sampler(model))
    for t in runs:
        assert t.env_mask[0] == 0 and 1 in t.env_mask  # an opening was forced, then the policy sampled
        ids = torch.tensor([t.prompt_ids + t.completion_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].float(), -1)
        n = len(t.prompt_ids)
        trained = [p for p, m in enumerate(t.env_mask) if m]
        recomputed = [float(logp[n + p - 1, t.completion_ids[p]]) for p in trained]
        assert recomputed == pytest.approx([t.logprobs[p] for p in trained], abs=1e-4)
    ro.close()


def tokenizers_with_calls():
    """Every tokenizer the tests build whose chat template writes tool calls: each convention of
    ``tests/conventions.py`` but Gemma 3's, and the toy model's (``trl_agentic.toy``)."""
    from conventions import CONVENTIONS

    return [c for c in CONVENTIONS if c != "gemma-3"] + ["toy"]


def load(name):
    """The tokenizer ``name`` names and the ids that end its model's turns."""
    if name == "toy":
        from trl_agentic.toy import build_tokenizer

        tok = build_tokenizer(tool_calling=True)
        return tok, [tok.convert_tokens_to_ids("<|im_end|>")]
    from conventions import build_convention

    convention = build_convention(name)
    return convention.load_tokenizer(), list(convention.eos_token_ids)


def own_call(tok, name="add", arguments=None):
    """The prompt ids of a request asking 2+3? with :data:`TOOLS`, and the ids of the chat template's own assistant
    turn calling ``name`` after them (the whole conversation tokenized at once, as the model saw its calls)."""
    messages = [{"role": "user", "content": "2+3?"}]
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": name, "arguments": arguments or {"a": 2, "b": 3}}}]}
    prompt = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    whole = tok.apply_chat_template(messages + [call], tools=TOOLS, tokenize=False)
    assert whole.startswith(prompt)
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    whole_ids = tok(whole, add_special_tokens=False)["input_ids"]
    assert whole_ids[:len(prompt_ids)] == prompt_ids
    return prompt_ids, whole_ids[len(prompt_ids):]


class OwnCallModel:
    """A model that continues whatever it was given with the chat template's own call to ``add``, token for token:
    it fails (the round fails) when the ids it is asked to continue are not a prefix of that call."""

    def __init__(self, tok, end_ids):
        self.prompt_ids, self.turn = own_call(tok)
        self.end_ids = end_ids

    def generate(self, prompts, max_new_tokens, stop_strings, eos_token_ids):
        out = []
        for prompt in prompts:
            assert prompt[:len(self.prompt_ids)] == self.prompt_ids
            opened = prompt[len(self.prompt_ids):]
            assert self.turn[:len(opened)] == opened, "the forced opening is not a prefix of the template's own call"
            rest = self.turn[len(opened):]
            end = next(i for i, t in enumerate(rest) if t in eos_token_ids)
            out.append(Generation(rest[:end + 1], [-0.5] * (end + 1)))
        return out


@pytest.mark.parametrize("name", tokenizers_with_calls())
def test_forced_openings_end_on_a_token_boundary_of_the_templates_own_call(name):
    """On every convention, the forced ids of ``"required"`` and of a named function are the first ids of the
    template's own call, token for token, and the model's own continuation of them is a call that parses."""
    from trl_agentic.agents import AgentRollout
    from trl_agentic.rollout.config import RolloutConfig

    tok, end_ids = load(name)

    async def agent(client, choice, **row):
        return await ask(client, choice)

    ro = AgentRollout(agent, tok, RolloutConfig(max_turns=2, max_tokens_per_turn=64, max_completion_length=128),
                      end_ids)
    runs = ro.run([{"choice": "required"}, {"choice": NAMED}], OwnCallModel(tok, end_ids))
    _, turn = own_call(tok)
    for t in runs:
        assert t.stop_reason == "terminated", t.error
        finish, calls, _ = t.agent_output
        assert (finish, calls) == ("tool_calls", [("add", {"a": 2, "b": 3})]), (name, t.agent_output)
        forced = t.env_mask.index(1)
        assert 0 < forced and t.completion_ids[:forced] == turn[:forced], tok.convert_ids_to_tokens(
            t.completion_ids[:forced])
        assert t.events["forced_call"] == 1 and not t.events.get("malformed_tool_call")
    ro.close()
