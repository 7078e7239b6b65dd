"""Names other libraries use, answered with ours: ``StepResult(done=...)`` (Gym) and ``AgenticPPOConfig(kl_coef=...)``
(TRL's former PPOConfig) say what to pass instead of Python's bare "unexpected keyword argument"."""

from __future__ import annotations

import inspect

import pytest
from helpers import ScriptedGenerator

from trl_agentic import AgenticPPOConfig, StepResult
from trl_agentic.rollout.engine import RolloutConfig, RolloutEngine


def test_step_result_done_names_terminated_and_truncated():
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'done': use terminated=True when the task ended "
                                        r"\(and truncated=True when the episode was cut short\)"):
        StepResult("obs", done=True)
    result = StepResult("obs", 1.0, True, info={"k": 1})  # everything else is the dataclass's own
    assert (result.observation, result.reward, result.terminated, result.truncated, result.info) == \
        ("obs", 1.0, True, False, {"k": 1})
    assert list(inspect.signature(StepResult).parameters) == ["observation", "reward", "terminated", "truncated",
                                                              "info"]
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'$"):
        StepResult(colour="red")


def test_an_environment_that_says_done_fails_its_trajectory_with_the_fix(tokenizer):
    """In a rollout the TypeError ends the trajectory (env_error); its error, which the degenerate-run stop quotes,
    says what to write."""

    class GymStyle:
        def reset(self, **row):
            return None

        def step(self, action):
            return StepResult(observation=None, reward=1.0, done=True)

    engine = RolloutEngine(ScriptedGenerator(tokenizer, lambda ids: "go"), tokenizer, GymStyle, RolloutConfig())
    (trajectory,) = engine.run(["p"], [{}])
    assert trajectory.stop_reason == "env_error" and "use terminated=True" in trajectory.error


@pytest.mark.parametrize("old,new", [("kl_coef", "beta"), ("cliprange", "epsilon"),
                                     ("num_ppo_epochs", "num_iterations"),
                                     ("missing_eos_penalty", "truncation_penalty")])
def test_ppo_config_names_the_field_that_replaced_trls(old, new, tmp_path):
    with pytest.raises(TypeError, match=rf"AgenticPPOConfig\(\) got an unexpected keyword argument '{old}': .*"
                                        rf"pass {new}="):
        AgenticPPOConfig(output_dir=str(tmp_path), **{old: 0.1})
    config = AgenticPPOConfig(output_dir=str(tmp_path), use_cpu=True, **{new: 0.1 if new != "num_iterations" else 2})
    assert getattr(config, new) == (0.1 if new != "num_iterations" else 2)
