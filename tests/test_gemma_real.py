"""The real Gemma-3-270M (PyPI GGUF, see ../shared/README.md): one real multi-turn rollout in each mode and one
LoRA training step, with the invariants of the convention matrix. Slow: about two minutes on 2 CPU cores."""

import pytest
import torch

from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer, run_rollouts
from trl_agentic.rollout.audit import unsampled_trained
from trl_agentic.rollout.observations import ObservationEncoder
from trl_agentic.toy import LookupEnvironment

pytestmark = pytest.mark.slow

PROMPT = (
    "Use the lookup tool to find a value: write <lookup>key</lookup>, read the <result>, then answer with "
    "<answer>value</answer>.\nQuestion: what is the value of key k7?\n"
)


@pytest.fixture(scope="module")
def gemma(gemma3_270m):
    return gemma3_270m, gemma3_270m.load_model()


@pytest.mark.parametrize("mode", ["text", "chat"])
def test_real_rollout(gemma, mode):
    conv, model = gemma
    prompt = PROMPT if mode == "text" else [{"role": "user", "content": PROMPT}]
    rows = [{"prompt": prompt, "value": "42"} for _ in range(4)]
    torch.manual_seed(0)
    trajectories = run_rollouts(model, conv.tokenizer, LookupEnvironment, rows, rollout_mode=mode,
                                observation_role="user", max_turns=2, max_tokens_per_turn=24,
                                max_completion_length=96)
    encoder = ObservationEncoder(conv.tokenizer, mode, "user", eos_token_ids=conv.eos_token_ids)
    eos_token_ids = set(conv.eos_token_ids) | ({encoder.layout.end_of_turn_id} if mode == "chat" else set())
    for t in trajectories:
        assert t.prompt_ids[0] == conv.tokenizer.bos_token_id and t.prompt_ids[1] != conv.tokenizer.bos_token_id
        assert unsampled_trained(t, t.env_mask, eos_token_ids) == 0
        for (start, stop), action in zip(t.turn_spans, t.actions):
            assert conv.tokenizer.decode(t.completion_ids[start:stop], skip_special_tokens=True) == action
            assert all(i not in eos_token_ids for i in t.completion_ids[start : stop - 1])
    assert any(t.num_turns >= 1 and len(t.completion_ids) > 0 for t in trajectories)


def test_lora_training_step(gemma, tmp_path):
    from datasets import Dataset
    from peft import LoraConfig

    conv, model = gemma
    args = AgenticGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2,
                             max_completion_length=48, max_tokens_per_turn=16, max_turns=2, max_steps=1,
                             learning_rate=1e-4, logging_steps=1, report_to="none", use_cpu=True, bf16=False,
                             save_strategy="no", beta=0.0, seed=0)

    def reward(completions, trajectory, **kwargs):  # differs between the two samples, so advantages are not 0
        return [float(i) for i, _ in enumerate(trajectory)]

    trainer = AgenticGRPOTrainer(model=model, reward_funcs=reward, args=args, processing_class=conv.tokenizer,
                                 train_dataset=Dataset.from_list([{"prompt": PROMPT, "value": "42"}] * 2),
                                 environment=LookupEnvironment,
                                 peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                        task_type="CAUSAL_LM"))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    row = next(r for r in trainer.state.log_history if "loss" in r)
    assert row["agentic/mask_audit"] == 0
    assert any(not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters() if n in before)


def test_native_tool_calls_stop_in_one_line(gemma, tmp_path):
    """Gemma-3's chat template renders no tool calls and TRL knows no response template for it, so TRL's ``tools=``
    cannot work with this model: construction stops in one line that says what to use instead (text tags)."""
    from datasets import Dataset

    conv, model = gemma

    def lookup(key: str) -> str:
        """
        Looks a key up.

        Args:
            key: The key.

        Returns:
            The value.
        """
        return "42"

    args = AgenticGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2,
                             max_completion_length=48, max_steps=1, report_to="none", use_cpu=True, bf16=False,
                             save_strategy="no", rollout_mode="chat")
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "What is the value of key k7?"}]}] * 2)
    with pytest.raises(ValueError, match="TagEnvironment") as error:
        AgenticGRPOTrainer(model=model, reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
                           args=args, processing_class=conv.tokenizer, train_dataset=dataset, tools=[lookup])
    assert "\n" not in str(error.value)
