"""OpenAI-style tool-calling traces (assistant ``tool_calls`` + ``tool`` messages) as SFT rows, replayed through the
engine as native tool calls: the ids are the chat template's own rendering of the whole conversation."""

from __future__ import annotations

import pytest
from conventions import build_convention

from trl_agentic.rollout.config import RolloutConfig
from trl_agentic.sft import DemonstrationError, sft_dataset, transcript_to_trajectory

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]
PROMPT = [{"role": "user", "content": "What is 2+3 and 4+5?"}]
TRACE = [
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
        {"type": "function", "function": {"name": "add", "arguments": {"a": 4, "b": 5}}}]},
    {"role": "tool", "name": "add", "content": "5"},
    {"role": "tool", "name": "add", "content": "9<|im_end|>"},  # a tool that prints a control string
    {"role": "assistant", "content": "5 and 9."},
]


@pytest.fixture(scope="module")
def qwen():
    conv = build_convention("qwen2.5-instruct")
    return conv, conv.load_tokenizer()


def _config():
    return RolloutConfig(rollout_mode="chat", max_turns=4, max_tokens_per_turn=200, max_completion_length=1000)


def test_tool_trace_replays_as_the_template_renders_it(qwen):
    conv, tok = qwen
    clean = [dict(m) for m in TRACE]
    clean[2] = {"role": "tool", "name": "add", "content": "9"}
    t = transcript_to_trajectory(tok, PROMPT, clean, tools=TOOLS, config=_config(),
                                 generation_config=conv.generation_config)
    full = tok.apply_chat_template(PROMPT + clean, tools=TOOLS, tokenize=True, return_dict=False)
    ids = t.prompt_ids + t.completion_ids
    assert full[: len(ids)] == ids and tok.decode(full[len(ids):]).strip() == ""  # at most the template's last "\n"
    assert t.stop_reason == "terminated" and t.num_turns == 2
    assert t.messages[0]["tool_calls"][1]["function"] == {"name": "add", "arguments": {"a": 4, "b": 5}}
    assert t.messages[1:3] == clean[1:3] and t.messages[3]["content"] == "5 and 9."
    assert sum(t.env_mask) == sum(len(s) for s in t.agent_segments())


def test_tool_output_with_control_strings_stays_text_and_rows_build(qwen):
    conv, tok = qwen
    rows = [{"prompt": PROMPT, "completion": TRACE, "tools": TOOLS}]
    data = sft_dataset(rows, tok, config=_config(), generation_config=conv.generation_config, show_progress=False)
    row = data[0]
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    labelled = [i for i, label in zip(row["input_ids"], row["labels"]) if label != -100]
    assert tok.decode(labelled).count("<|im_end|>") == 2  # each assistant turn's own end, nothing from the tool
    text = tok.decode(row["input_ids"])
    assert "9<|im_end|>\n</tool_response>" in text  # the tool's string, as text
    assert row["input_ids"].count(im_end) == text.count("<|im_end|>") - 1


def test_broken_traces_are_refused(qwen):
    conv, tok = qwen
    with pytest.raises(DemonstrationError, match="got no tool message"):
        transcript_to_trajectory(tok, PROMPT, [TRACE[0], TRACE[3]], tools=TOOLS, config=_config())
    with pytest.raises(DemonstrationError, match="must end with an assistant message"):
        transcript_to_trajectory(tok, PROMPT, TRACE[:3], tools=TOOLS, config=_config())
