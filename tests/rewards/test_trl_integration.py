"""The rewards inside one real step of plain ``trl.GRPOTrainer`` (tiny random model, CPU)."""

import pytest

from trl_agentic.environments.tag_protocol import TagProtocol
from trl_agentic.rewards import (
    Component,
    CompositeReward,
    FormatReward,
    LengthPenalty,
    LinearSchedule,
    MathAnswerReward,
)


def test_composite_reward_in_plain_grpo_trainer(tiny_model_dir, tokenizer, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    pytest.importorskip("math_verify")
    data = Dataset.from_list([{"prompt": f"what is {i} + {i} ?", "answer": f"#### {2 * i}"} for i in range(4)])
    reward = CompositeReward([
        Component("math", MathAnswerReward(), outcome=True),
        Component("format", FormatReward(TagProtocol(tools={})), weight=LinearSchedule(0.5, 0.0)),
        Component("length", LengthPenalty.overlong(max_length=8, cache_length=4), weight=0.1),
    ])
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=8, max_steps=1, learning_rate=1e-3, logging_steps=1, report_to="none",
                      use_cpu=True, bf16=False, seed=0, save_strategy="no")
    trainer = GRPOTrainer(model=tiny_model_dir, reward_funcs=reward, args=args, train_dataset=data,
                          processing_class=tokenizer)
    trainer.train()
    logged = next(row for row in trainer.state.log_history if "loss" in row)
    for key in ("rewards/composite_reward/mean", "reward/math", "reward/format", "reward/length", "reward/total",
                "reward/format/weight"):
        assert key in logged, key
    assert logged["reward/format/weight"] == 0.5
