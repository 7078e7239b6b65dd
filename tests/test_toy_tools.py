"""The tiny model of the README and the docs (``save_tiny_model``) can be given tools natively: its chat template is
Qwen2.5-Instruct's, which TRL's ``supports_tool_calling`` accepts and whose calls TRL parses; TRL's own
``GRPOTrainer(tools=...)`` trains on it, with the toy ``add`` task."""

from __future__ import annotations


def test_the_tiny_models_template_calls_tools(tmp_path):
    from transformers import AutoTokenizer
    from trl import add_response_schema
    from trl.chat_template_utils import supports_tool_calling

    from trl_agentic.toy import add, save_tiny_model

    tok = AutoTokenizer.from_pretrained(save_tiny_model(str(tmp_path / "tiny")))
    assert supports_tool_calling(tok)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 1 plus 2?"}], tools=[add], tokenize=False,
                                     add_generation_prompt=True)
    assert '"name": "add"' in prompt and "Add two integers." in prompt and prompt.endswith("<|im_start|>assistant\n")
    assert len(tok.encode("<tool_call>", add_special_tokens=False)) == 1  # an added token, as Qwen2.5 ships it
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call><|im_end|>'
    message = add_response_schema(tok).parse_response(tok.encode(text, add_special_tokens=False), prefix=[])
    assert message["tool_calls"] == [{"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]


def test_the_addition_task(tmp_path):
    from datasets import load_dataset

    from trl_agentic.toy import add, addition_reward, make_addition_dataset, save_addition_dataset

    rows = make_addition_dataset(3)
    a, b = (int(x) for x in rows[0]["prompt"][0]["content"].removeprefix("What is ").rstrip("?").split(" plus "))
    assert str(add(a, b)) == rows[0]["answer"]
    loaded = load_dataset(save_addition_dataset(str(tmp_path / "data"), 3), split="train")
    assert [dict(r) for r in loaded] == rows
    answer = rows[0]["answer"]
    completions = [
        [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "add"}}]},
         {"role": "tool", "name": "add", "content": answer}],  # the result alone is not an answer
        [{"role": "assistant", "content": f"It is {answer}."}],
        f"It is {answer}.",
    ]
    assert addition_reward(completions, [answer] * 3) == [0.0, 1.0, 1.0]


def test_trls_grpo_trainer_with_tools_trains_on_the_tiny_model(tmp_path):
    """TRL 1.16's GRPOTrainer refuses a template that cannot render tool calls (the plain ChatML the tiny model had);
    this one it accepts, and its own tool loop trains a step."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from trl_agentic.toy import add, addition_reward, make_addition_dataset, save_tiny_model

    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=64, max_steps=1, use_cpu=True, bf16=False, report_to="none",
                      save_strategy="no", seed=0)
    trainer = GRPOTrainer(model=save_tiny_model(str(tmp_path / "tiny")), reward_funcs=addition_reward, tools=[add],
                          train_dataset=Dataset.from_list(make_addition_dataset(4)), args=args)
    trainer.train()
    assert trainer.state.global_step == 1 and trainer.tools == [add]
    assert trainer.state.log_history[-1]["train_loss"] is not None
