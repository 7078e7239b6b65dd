"""Shared pieces of the agent-endpoint tests: the tiny Qwen2.5-Instruct convention (a real chat template with
tools), a model whose turns are scripted through a logits processor (a random model never writes a well-formed
tool call), and agents written with the OpenAI SDK."""

from __future__ import annotations

import json

import torch

HEADER = "<|im_start|>assistant\n"

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]


def call(name, **arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class ScriptedLogits:
    """Forces, on every row, the tokens of turn ``k`` of ``turns`` (``k`` = assistant headers in the context - 1),
    then ``<|im_end|>``."""

    def __init__(self, tokenizer, turns):
        encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.header = encode(HEADER)
        self.turns = [encode(text) + [self.end] for text in turns]

    def __call__(self, input_ids, scores):
        out = torch.full_like(scores, float("-inf"))
        n = len(self.header)
        for row, ids in enumerate(input_ids.tolist()):
            starts = [i for i in range(len(ids) - n + 1) if ids[i:i + n] == self.header]
            turn = self.turns[min(len(starts) - 1, len(self.turns) - 1)]
            offset = len(ids) - starts[-1] - n
            out[row, turn[offset] if offset < len(turn) else self.end] = 0.0
        return out


def scripted(model, tokenizer, turns):
    """``model.generate`` with the script's logits processor added (instance attribute; test double only)."""
    from transformers import LogitsProcessorList

    original, script = model.generate, ScriptedLogits(tokenizer, turns)

    def generate(*args, **kwargs):
        processors = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
        processors.append(script)
        return original(*args, logits_processor=processors, **kwargs)

    model.generate = generate
    return model


def add_dataset(n=4):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"What is {i} plus 3?"}] for i in range(n)],
                              "question": [f"What is {i} plus 3?" for i in range(n)],
                              "answer": [i + 3 for i in range(n)]})


async def sdk_agent(client, question, **row):
    """A tool-calling loop written with the OpenAI SDK."""
    messages = [{"role": "user", "content": question}]
    for _ in range(4):
        response = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content
        for tool_call in message.tool_calls:
            args = json.loads(tool_call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": str(args["a"] + args["b"])})
    return None


def answer_reward(completions, agent_output, answer, **kwargs):
    return [float(str(a) in (out or "")) for out, a in zip(agent_output, answer)]


def config(config_class, tmp_path, **extra):
    values = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                  max_completion_length=128, max_tokens_per_turn=64, max_turns=4, max_steps=2, learning_rate=1e-3,
                  report_to="none", use_cpu=True, bf16=False, seed=0, save_strategy="no", logging_steps=1)
    return config_class(**{**values, **extra})
