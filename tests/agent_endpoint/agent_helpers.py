"""Shared pieces of the agent-endpoint tests: the tiny Qwen2.5-Instruct convention (a real chat template with
tools), a model whose turns are scripted through a logits processor (a random model never writes a well-formed
tool call), and agents written with the OpenAI SDK."""

from __future__ import annotations

import json

from helpers import native_call as call  # noqa: F401 - re-exported for the agent tests
from helpers import scripted  # noqa: F401

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]
RESPONSES_TOOLS = [{"type": "function", **TOOLS[0]["function"]}]  # the Responses API's flat form


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


async def responses_agent(client, question, **row):
    """The same tool-calling loop on the Responses API (``client.responses.create``)."""
    items = [{"role": "user", "content": question}]
    for _ in range(4):
        response = await client.responses.create(model="policy", input=items, tools=RESPONSES_TOOLS)
        items += [item.model_dump(exclude_none=True) for item in response.output]
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            return response.output_text
        for tool_call in calls:
            args = json.loads(tool_call.arguments)
            items.append({"type": "function_call_output", "call_id": tool_call.call_id,
                          "output": str(args["a"] + args["b"])})
    return None


def answer_reward(completions, agent_output, answer, **kwargs):
    return [float(str(a) in (out or "")) for out, a in zip(agent_output, answer)]


def config(config_class, tmp_path, **extra):
    values = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                  max_completion_length=128, max_tokens_per_turn=64, max_turns=4, max_steps=2, learning_rate=1e-3,
                  report_to="none", use_cpu=True, bf16=False, seed=0, save_strategy="no", logging_steps=1)
    return config_class(**{**values, **extra})


def agent_trainer(qwen, tmp_path, trainer_name, agent, turns, **extra):
    """An ``AgenticGRPOTrainer`` (``trainer_name="grpo"``) or ``AgenticPPOTrainer`` (``"ppo"``) for ``agent`` on
    :func:`add_dataset`, its tiny model scripted with ``turns``, and the list that collects every run it makes."""
    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer, AgenticPPOConfig, AgenticPPOTrainer

    tok = qwen.load_tokenizer()
    kwargs = dict(model=scripted(qwen.load_model(), tok, turns), processing_class=tok, train_dataset=add_dataset(),
                  reward_funcs=answer_reward, agent=agent)
    if trainer_name == "grpo":
        trainer = AgenticGRPOTrainer(args=config(AgenticGRPOConfig, tmp_path, **extra), **kwargs)
    else:
        args = config(AgenticPPOConfig, tmp_path, beta=0.05, **extra)
        args.num_generations = 1
        trainer = AgenticPPOTrainer(args=args, **kwargs)
    runs, run = [], trainer.rollout_seam.runner.run

    def keep(*args, **kw):
        runs.extend(run(*args, **kw))
        return runs[-len(args[0]):]

    trainer.rollout_seam.runner.run = keep
    return trainer, runs
