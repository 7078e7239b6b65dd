"""The README's "bring your own environment" example: the Environment subclass and the reward that reads
``trajectory`` train for a step with AgenticGRPOTrainer, and the environment does what the README says."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import ScriptedGenerator

README = Path(__file__).resolve().parents[1] / "README.md"


def _example() -> dict:
    section = README.read_text(encoding="utf-8").split("## Bring your own environment", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    definitions = code.split("\ntrainer = ", 1)[0]  # the trainer line needs a GPU-sized model; built below instead
    assert len(definitions.strip().splitlines()) <= 30
    namespace: dict = {}
    exec(compile(definitions, "README example", "exec"), namespace)  # noqa: S102 - our own documentation
    return namespace


def test_environment_answers_as_documented(tokenizer):
    from trl_agentic import run_rollouts

    example = _example()
    guesses = iter(["I think <guess>3</guess>", "hmm", "<guess>9</guess>", "<guess>7</guess>"])
    generator = ScriptedGenerator(tokenizer, lambda ids: next(guesses))
    (t,) = run_rollouts(None, tokenizer, example["Guess"], [{"prompt": "Guess a number", "target": 7}],
                        generator=generator, max_turns=6, max_tokens_per_turn=60, max_completion_length=400)
    assert t.observations[:3] == ["<hint>higher</hint>", "Write your guess as <guess>N</guess>.", "<hint>lower</hint>"]
    assert t.stop_reason == "terminated" and t.num_turns == 4 and t.turn_rewards[-1] == 1.0
    assert example["solved"](completions=["x"], trajectory=[t]) == [1.0 - 0.4]


def test_example_trains(tiny_model_dir, tmp_path):
    from datasets import Dataset

    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer

    example = _example()
    dataset = Dataset.from_list([{"prompt": f"Guess a number from 1 to 9 ({i})", "target": i % 9 + 1}
                                 for i in range(8)])
    args = AgenticGRPOConfig(output_dir=str(tmp_path), max_turns=3, max_tokens_per_turn=8, max_completion_length=160,
                             num_generations=2, per_device_train_batch_size=4, max_steps=1, use_cpu=True, bf16=False,
                             report_to="none", save_strategy="no", logging_steps=1)
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=example["solved"], environment=example["Guess"],
                                 args=args, train_dataset=dataset)
    trainer.train()
    logged = trainer.state.log_history[0]
    assert logged["agentic/turns_mean"] > 1 and logged["agentic/invalid_per_trajectory"] > 0
    assert re.fullmatch(r"-?[0-9.]+", str(logged["reward"]))
