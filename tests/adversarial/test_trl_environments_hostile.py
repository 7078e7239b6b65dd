"""Hostile ``environment_factory`` environments (TRL 1.16's contract) through our engine: each fault costs at most its
own trajectory, or, when it can never work, fails before training in one line. (TRL's own loop lets each of these end
the batch or the run.)"""

from __future__ import annotations

import threading

import pytest
import torch
from conventions import build_convention
from helpers import ScriptedGenerator
from test_trl_environments import IncrementEnv, _config, call, increment_dataset, scripted

from trl_agentic.environments.trl_environments import TRLEnvironments
from trl_agentic.rollout.config import RolloutConfig
from trl_agentic.rollout.engine import RolloutEngine


@pytest.fixture(scope="module")
def qwen():
    return build_convention("qwen2.5-instruct")


def _engine(qwen, source, script, env_timeout=60.0):
    config = RolloutConfig(rollout_mode="chat", max_tokens_per_turn=60, max_completion_length=200, max_turns=3,
                           overlap_chunks=1, env_timeout=env_timeout)
    generator = ScriptedGenerator(qwen.tokenizer, script)
    return RolloutEngine(generator, qwen.tokenizer, source, config, eos_token_ids=list(qwen.eos_token_ids))


def _run(engine, source, rows):
    prompt = [{"role": "user", "content": "Go."}]
    envs = [source() for _ in rows]
    return engine.run([prompt] * len(rows), rows, environments=envs), envs


def _done(ids):
    return "Done.<|im_end|>"


# -- what can never work fails before training, in one line ------------------------------------------------------
def _trainer(qwen, tmp_path, dataset, factory):
    from trl import GRPOConfig

    from trl_agentic import AgenticGRPOTrainer

    return AgenticGRPOTrainer(model=qwen.model_dir, reward_funcs=lambda completions, **k: [0.0] * len(completions),
                              args=_config(GRPOConfig, tmp_path), train_dataset=dataset, environment_factory=factory)


def test_reset_parameter_without_a_column_fails_before_training(qwen, tmp_path):
    dataset = increment_dataset().remove_columns("target")  # IncrementEnv.reset(target, ...) can never be called
    with pytest.raises(ValueError, match=r"^IncrementEnv.reset\(\) needs target, which no dataset column provides"):
        _trainer(qwen, tmp_path, dataset, IncrementEnv)
    with pytest.raises(ValueError, match=r"^IncrementEnv.reset\(\) needs target"):  # in a dict factory too
        _trainer(qwen, tmp_path, dataset.add_column("environment", ["inc"] * len(dataset)), {"inc": IncrementEnv})


def test_dict_factory_without_an_environment_column_fails_before_training(qwen, tmp_path):
    with pytest.raises(ValueError, match=r"^a dict environment_factory picks each row's environment by its "
                                         r"'environment' column, which train_dataset lacks"):
        _trainer(qwen, tmp_path, increment_dataset(), {"inc": IncrementEnv})


def test_factory_that_raises_at_once_fails_before_training(qwen, tmp_path):
    def broken():
        raise RuntimeError("no licence server")

    with pytest.raises(ValueError, match="^environment_factory 'broken' raised RuntimeError: no licence server; "):
        _trainer(qwen, tmp_path, increment_dataset(), broken)


# -- what fails on some rows costs those trajectories ------------------------------------------------------------
def test_unknown_environment_name_costs_its_trajectory(qwen):
    source = TRLEnvironments(environment_factory={"inc": IncrementEnv})
    (ok, unknown), _ = _run(_engine(qwen, source, _done), source,
                            [{"environment": "inc", "target": 1}, {"environment": "inc_v2", "target": 1}])
    assert ok.stop_reason == "terminated"
    assert unknown.stop_reason == "env_error" and "environment='inc_v2' is not among" in unknown.error


def test_factory_that_raises_later_costs_its_trajectory(qwen):
    made = []

    def factory():
        made.append(1)
        if len(made) > 1:  # the probe and the first rollout's instance work; the next one fails
            raise RuntimeError("out of licences")
        return IncrementEnv()

    source = TRLEnvironments(environment_factory=factory)
    first, second = _run(_engine(qwen, source, _done), source, [{"target": 1}, {"target": 2}])[0]
    assert first.stop_reason == "terminated"
    assert second.stop_reason == "env_error" and "out of licences" in second.error


class Hanging(IncrementEnv):
    """``reset`` or ``increment`` hang until released, for the rows that ask."""

    release = threading.Event()
    entered: list = []

    def reset(self, target, hang=None, **kwargs):
        Hanging.entered.append(self)
        super().reset(target)
        if hang == "reset":
            Hanging.release.wait(30)

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.
        """
        if step == 99:
            Hanging.release.wait(30)
        return super().increment(step)


def test_hanging_reset_or_method_costs_its_trajectory_and_its_instance_is_not_reused(qwen):
    """A reset past env_timeout ends its trajectory (env_timeout), a method past tool_timeout answers an error; the
    instance, still busy on an abandoned thread, never serves a later rollout."""
    Hanging.entered.clear()
    Hanging.release.clear()
    source = TRLEnvironments(environment_factory=Hanging, tool_timeout=0.5)
    engine = _engine(qwen, source, lambda ids: (call("increment", step=99) if "hang-tool" in qwen.tokenizer.decode(ids)
                                                and "<tool_response>" not in qwen.tokenizer.decode(ids)
                                                else "Done.") + "<|im_end|>", env_timeout=1.0)
    prompt = [{"role": "user", "content": "Go."}]
    rows = [{"target": 1}, {"target": 1, "hang": "reset"}, {"target": 1}]
    prompts = [prompt, prompt, [{"role": "user", "content": "Go, hang-tool."}]]
    try:
        envs = [source() for _ in rows]
        ok, hung, slow_tool = engine.run(prompts, rows, environments=envs)
        assert ok.stop_reason == "terminated" and hung.stop_reason == "env_timeout"
        assert "timed out" in slow_tool.observations[0] and slow_tool.stop_reason == "terminated"
        busy = {id(envs[1].instance), id(envs[2].instance)}
        Hanging.entered.clear()
        again = engine.run([prompt] * 3, [{"target": 1}] * 3, environments=[source() for _ in range(3)])
        assert [t.stop_reason for t in again] == ["terminated"] * 3
        assert len(Hanging.entered) == 3 and not busy & {id(e) for e in Hanging.entered}
    finally:
        Hanging.release.set()


class Judged(IncrementEnv):
    """``get_reward`` misbehaves by target: raises (1), NaN (2), a string (4); 3 is scored."""

    def get_reward(self):
        if self.target == 1:
            raise RuntimeError("judge unavailable")
        return {2: float("nan"), 4: "high"}.get(self.target, float(self.counter == self.target))


def test_get_reward_that_raises_or_returns_nan_or_text_costs_its_trajectory(qwen, tmp_path):
    from trl import GRPOConfig

    from trl_agentic import AgenticGRPOTrainer

    tok = qwen.load_tokenizer()
    model = scripted(qwen.load_model(), tok, [call("increment", step=3), "Done."])
    trainer = AgenticGRPOTrainer(model=model, processing_class=tok, train_dataset=increment_dataset(),
                                 reward_funcs=lambda completions, **k: [0.25] * len(completions),
                                 args=_config(GRPOConfig, tmp_path, beta=0.0), environment_factory=Judged)
    rows = [{"prompt": [{"role": "user", "content": f"Count to {t}."}], "target": t} for t in (1, 2, 3, 4)]
    round_ = trainer.generation_round(rows)
    env_rewards = round_.rewards_per_func[:, trainer.reward_func_names.index("Judged")]
    assert torch.isnan(env_rewards[[0, 1, 3]]).all() and env_rewards[2].item() == 1.0
    assert round_.rewards_per_func[:, 0].tolist() == [0.25] * 4  # the other reward scored every rollout
    assert torch.isfinite(trainer.training_batch(rows).advantages).all()


# -- through the whole training step -----------------------------------------------------------------------------
class ReadsAMissingColumn(IncrementEnv):
    """``reset(**kwargs)`` reads a column the dataset lacks (``**kwargs``: no signature check can see it)."""

    def reset(self, **kwargs):
        super().reset(kwargs["goal"])


class OddRowsFail(IncrementEnv):
    def reset(self, target, **kwargs):
        if target % 2:
            raise RuntimeError(f"no slot for target {target}")
        super().reset(target)


def _failing_reset_trainer(qwen, tmp_path, trainer_name, factory):
    from trl import GRPOConfig

    from trl_agentic import AgenticGRPOTrainer, AgenticPPOConfig, AgenticPPOTrainer

    tok = qwen.load_tokenizer()
    model = scripted(qwen.load_model(), tok, [call("increment", step=2), "Done."])
    reward = lambda completions, **k: [1.0] * len(completions)  # noqa: E731
    if trainer_name == "grpo":
        return AgenticGRPOTrainer(model=model, processing_class=tok, train_dataset=increment_dataset(),
                                  reward_funcs=reward, environment_factory=factory,
                                  args=_config(GRPOConfig, tmp_path, max_steps=3, per_device_train_batch_size=4))
    args = _config(AgenticPPOConfig, tmp_path, rollout_mode="chat", max_tokens_per_turn=96, max_steps=3)
    args.num_generations = 1
    return AgenticPPOTrainer(model=model, processing_class=tok, train_dataset=increment_dataset(),
                             reward_funcs=reward, args=args, environment_factory=factory)


@pytest.mark.parametrize("trainer_name", ["grpo", "ppo"])
def test_a_reset_failing_on_some_rows_trains_to_the_end(qwen, tmp_path, trainer_name):
    """The reset case of issue 50: a TRL-style environment whose ``reset`` raises on odd rows; the run trains to its
    last step and the failed rows cost themselves (transformers >= 5.24 read their empty completion as an empty
    batch in the reward inputs and killed the run)."""
    trainer = _failing_reset_trainer(qwen, tmp_path, trainer_name, OddRowsFail)
    trainer.train()
    assert trainer.state.global_step == 3
    failed = [e["agentic/env_error_per_trajectory"] for e in trainer.state.log_history
              if "agentic/env_error_per_trajectory" in e]
    assert len(failed) == 3 and sum(failed) / 3 == 0.5  # two questions a step, one epoch: targets 1, 3, 5 failed


@pytest.mark.parametrize("trainer_name", ["grpo", "ppo"])
def test_a_reset_failing_on_every_row_stops_in_one_line(qwen, tmp_path, trainer_name):
    """``reset(**kwargs)`` reads a column the dataset lacks: no row can ever be scored, so the run stops after a few
    rounds with one line that names the error, instead of training on nothing."""
    from trl_agentic.trainers.checks import DegenerateTrainingError

    trainer = _failing_reset_trainer(qwen, tmp_path, trainer_name, ReadsAMissingColumn)
    with pytest.raises(DegenerateTrainingError, match=r"every trajectory ended env_error; the first error: "
                                                      r"TRLEnvironment.reset raised KeyError: 'goal'"):
        trainer.train()
