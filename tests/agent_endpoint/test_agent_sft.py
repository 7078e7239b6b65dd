"""SFT for an agent of any framework (``sft_dataset(..., agent=)``, issue 58): a demonstration runs through the agent
itself against the endpoint, its model calls answered with the demonstration's assistant turns, so the SFT rows are
the ids RL records when the model samples those turns."""

from __future__ import annotations

from agent_helpers import add_dataset, agent_trainer, call, sdk_agent

from trl_agentic.sft import sft_dataset

TURNS = [call("add", a=2, b=3), "It is 5."]


def demonstration(row):
    tool_call = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    return {**row, "completion": [{"role": "assistant", "content": "", "tool_calls": [tool_call]},
                                  {"role": "tool", "content": "5"},
                                  {"role": "assistant", "content": "It is 5."}]}


def test_an_agents_sft_rows_are_what_rl_records_for_the_same_turns(qwen, tmp_path):
    row = dict(add_dataset(1)[0])
    data = sft_dataset([demonstration(row)], qwen.load_tokenizer(), agent=sdk_agent, show_progress=False,
                       generation_config=qwen.generation_config, max_tokens_per_turn=64, max_completion_length=128)
    trainer, runs = agent_trainer(qwen, tmp_path, "grpo", sdk_agent, TURNS)
    rl = trainer.rollout_seam.run([row])[0][0]
    segments = rl.training_rows()
    assert len(data) == len(segments) == 1
    assert data[0]["input_ids"] == segments[0].prompt_ids + segments[0].completion_ids
    trained = [i for i, label in zip(data[0]["input_ids"], data[0]["labels"]) if label != -100]
    assert trained == [i for i, m in zip(segments[0].completion_ids, segments[0].env_mask) if m]
    assert "It is 5." in qwen.tokenizer.decode(trained) and "<tool_call>" in qwen.tokenizer.decode(trained)


def test_a_demonstration_the_agent_does_not_follow_is_skipped_with_the_reason(qwen):
    import pytest

    row = dict(add_dataset(1)[0])
    short = {**row, "completion": [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]}]}
    with pytest.warns(UserWarning, match="the agent made 2 model calls; the demonstration has 1 assistant turns"):
        with pytest.raises(ValueError, match="no example could be converted"):
            sft_dataset([short], qwen.load_tokenizer(), agent=sdk_agent, show_progress=False,
                        generation_config=qwen.generation_config, max_tokens_per_turn=64, max_completion_length=128)
