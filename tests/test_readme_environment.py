"""The guide's "bring your own environment" example: the environment and the reward that reads ``trajectory`` do
what the guide says (tests/test_readme_blocks.py runs the whole block, training included)."""

from __future__ import annotations

from pathlib import Path

from helpers import ScriptedGenerator

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"


def _example() -> dict:
    section = GUIDE.read_text(encoding="utf-8").split("## Bring your own environment", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    definitions = code.split("\ndataset = ", 1)[0]  # the classes and the reward; the block trains in test_readme_blocks
    assert len(definitions.strip().splitlines()) <= 30
    namespace: dict = {}
    exec(compile(definitions, "docs/guide.md example", "exec"), namespace)  # noqa: S102 - our own documentation
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

