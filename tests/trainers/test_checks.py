"""A run that can only train on nothing fails at construction, or stops after ``max_degenerate_steps`` rounds, with
one line that names the fix (trl_agentic/kinds/checks.py, trl_agentic/trainers/run_health.py). Each case here let
``train()`` run to the end at loss 0 (or fail deep inside TRL) before the checks existed."""

from __future__ import annotations

import json

import pytest
from datasets import Dataset
from helpers import EchoEnvironment, agentic_args, lookup_dataset

from trl_agentic import AgenticGRPOTrainer, Environment, StepResult, run_rollouts
from trl_agentic.toy import LookupEnvironment, lookup_reward


class Guess(Environment):
    stop_strings = ["</guess>"]

    def reset(self, target: int, **row) -> None:
        self.target = target

    def step(self, action: str) -> StepResult:
        return StepResult("<hint>higher</hint>")


def any_reward(completions, **kwargs):
    return [0.0 for _ in completions]


def _trainer(tiny_model_dir, tokenizer, tmp_path, environment=LookupEnvironment, dataset=None, rewards=lookup_reward,
             **args):
    return AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=rewards, args=agentic_args(tmp_path, **args),
                              train_dataset=lookup_dataset(8) if dataset is None else dataset,
                              processing_class=tokenizer, environment=environment)


def test_environment_instance_is_refused(tiny_model_dir, tokenizer, tmp_path):
    with pytest.raises(TypeError, match=r"got an instance of LookupEnvironment; pass LookupEnvironment \(the class\)"):
        _trainer(tiny_model_dir, tokenizer, tmp_path, environment=LookupEnvironment())


def test_native_tool_calls_without_a_response_template_are_refused(tiny_model_dir, tokenizer, tmp_path):
    """A ToolCallEnvironment (environment=, not TRL's tools=) with a chat template TRL knows no response template for
    (the toy ChatML) failed at the first rollout; it fails at construction with the line TRL's tools= path gives."""
    import functools

    from trl_agentic.environments.native_tools import ToolCallEnvironment

    def calculate(expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: The expression.
        """
        return "4"

    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "2 + 2?"}]}] * 4)
    with pytest.raises(ValueError, match="native tool calls need a response template to parse the model's calls, "
                                         "and TRL knows none for the chat template"):
        AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=any_reward, train_dataset=dataset,
                           processing_class=tokenizer, args=agentic_args(tmp_path, rollout_mode="chat"),
                           environment=functools.partial(ToolCallEnvironment, tools=[calculate]))


def test_dataset_without_prompt_is_refused(tiny_model_dir, tokenizer, tmp_path):
    rows = [{"question": f"find key k{i}", "key": f"k{i}", "value": str(i)} for i in range(8)]
    with pytest.raises(ValueError, match=r"train_dataset has no 'prompt' column.* dataset.rename_column\('question', 'prompt'\)"):
        _trainer(tiny_model_dir, tokenizer, tmp_path, dataset=Dataset.from_list(rows))


def test_reward_that_cannot_bind_trl_keywords_is_refused(tiny_model_dir, tokenizer, tmp_path):
    def exact(completions, trajectory):  # TRL also passes prompts, trainer_state, the columns...
        return [1.0 for _ in completions]

    with pytest.raises(TypeError, match=r"reward function 'exact' does not accept prompts.*add \*\*kwargs"):
        _trainer(tiny_model_dir, tokenizer, tmp_path, rewards=[lookup_reward, exact])

    def typo(completions, answer_value, **kwargs):  # no such column
        return [1.0 for _ in completions]

    with pytest.raises(TypeError, match=r"'typo' needs answer_value, which TRL does not pass"):
        _trainer(tiny_model_dir, tokenizer, tmp_path, rewards=typo)


def test_reset_parameter_no_column_fills_is_refused(tiny_model_dir, tokenizer, tmp_path):
    rows = [{"prompt": "Guess a number", "tagret": 3}] * 8
    with pytest.raises(ValueError, match=r"Guess.reset\(\) needs target, which no dataset column provides .*tagret"):
        _trainer(tiny_model_dir, tokenizer, tmp_path, environment=Guess, dataset=Dataset.from_list(rows),
                 rewards=any_reward)


def test_stop_strings_as_a_string_is_refused(tiny_model_dir, tokenizer, tmp_path):
    class Split(Guess):
        stop_strings = "</guess>"

    rows = [{"prompt": "Guess a number", "target": 3}] * 8
    with pytest.raises(TypeError, match=r"Split.stop_strings is the string '</guess>'.*write \['</guess>'\]"):
        _trainer(tiny_model_dir, tokenizer, tmp_path, environment=Split, dataset=Dataset.from_list(rows),
                 rewards=any_reward)
    # a factory hides the class until it is called: the engine refuses it at the first batch
    from helpers import ScriptedGenerator

    with pytest.raises(TypeError, match=r"Split.stop_strings is the string"):
        run_rollouts(None, tokenizer, lambda: Split(), [{"prompt": "Guess", "target": 3}],
                     generator=ScriptedGenerator(tokenizer, lambda ids: "<guess>1</guess>"), max_turns=2)


def test_valid_setups_pass_the_checks(tiny_model_dir, tokenizer, tmp_path):
    from functools import partial

    rows = [{"prompt": "Guess a number", "target": 3}] * 8

    def named(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, target, trajectory):
        return [0.0 for _ in completions]

    _trainer(tiny_model_dir, tokenizer, tmp_path, environment=partial(Guess), dataset=Dataset.from_list(rows),
             rewards=[named, any_reward])
    _trainer(tiny_model_dir, tokenizer, tmp_path, environment=lambda: LookupEnvironment())


def test_trl_passes_the_keywords_the_check_expects(tiny_model_dir, tokenizer, tmp_path):
    """Contract: the keyword arguments TRL gives a reward function are TRL_REWARD_KWARGS, the columns but prompt,
    and our trajectory."""
    from trl_agentic.kinds.checks import TRL_REWARD_KWARGS

    received: list[set] = []

    def recording(**kwargs):
        received.append(set(kwargs))
        return [0.0 for _ in kwargs["completions"]]

    data = lookup_dataset(8)
    _trainer(tiny_model_dir, tokenizer, tmp_path, dataset=data, rewards=recording, max_steps=1).train()
    columns = set(data.column_names) - {"prompt"}
    assert received and received[0] == {*TRL_REWARD_KWARGS, "trajectory", *columns}


def _steps_written(directory) -> list[int]:
    lines = (directory / "trajectories-rank0.jsonl").read_text().splitlines()
    return sorted({json.loads(line)["step"] for line in lines})


def test_every_environment_failing_stops_the_run(tiny_model_dir, tokenizer, tmp_path):
    from trl_agentic.trainers.checks import DegenerateTrainingError

    rows = [{"prompt": f"say {i}", "fail": "reset"} for i in range(8)]
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, environment=EchoEnvironment,
                       dataset=Dataset.from_list(rows), rewards=any_reward, max_steps=6, max_degenerate_steps=2,
                       trajectory_dir=str(tmp_path / "traj"))
    with pytest.raises(DegenerateTrainingError) as caught:
        trainer.train()
    message = str(caught.value)
    assert "2 generation rounds in a row" in message and "env_error" in message and "reset failed" in message
    assert str(tmp_path / "traj") in message and "\n" not in message
    assert trainer.state.global_step == 1 and _steps_written(tmp_path / "traj") == [0, 1]


def test_every_reward_none_stops_the_run(tiny_model_dir, tokenizer, tmp_path):
    from trl_agentic.trainers.checks import DegenerateTrainingError

    def broken(completions, trajectory, **kwargs):
        raise KeyError("solution")

    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, rewards=broken, max_steps=6, max_degenerate_steps=1)
    with pytest.raises(DegenerateTrainingError, match=r"every reward function returned None.*set trajectory_dir="):
        trainer.train()
    assert trainer.state.global_step == 0


def test_max_degenerate_steps_zero_trains_to_the_end(tiny_model_dir, tokenizer, tmp_path):
    rows = [{"prompt": f"say {i}", "fail": "reset"} for i in range(8)]
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, environment=EchoEnvironment,
                       dataset=Dataset.from_list(rows), rewards=any_reward, max_steps=2, max_degenerate_steps=0)
    trainer.train()
    assert trainer.state.global_step == 2


def test_max_degenerate_steps_is_validated(tmp_path):
    with pytest.raises(ValueError, match="max_degenerate_steps must be an integer >= 0"):
        agentic_args(tmp_path, max_degenerate_steps=-1)
