"""A run that loses trajectories, or cannot learn, says so in one line (issue 50): the failed rows of a round named
once, a warning for a run with nothing to learn from, and a budget that cannot hold one tool call refused before
training."""

from __future__ import annotations

import logging
from collections import Counter

import pytest
from conventions import build_convention
from helpers import scripted
from test_trl_environments import IncrementEnv, _config, increment_dataset

from trl_agentic.rollout.metrics import RoundFailures, failure_line
from trl_agentic.trainers.run_health import RunHealth
from trl_agentic.trajectory import Trajectory

BASE_LOGGER = "trl_agentic.trainers.base"


@pytest.fixture(scope="module")
def qwen():
    return build_convention("qwen2.5-instruct")


# -- the pure parts ---------------------------------------------------------------------------------------------
def test_failure_line_counts_every_process_and_quotes_one_error():
    ok = Trajectory(prompt_ids=[1], stop_reason="terminated")
    failed = Trajectory(prompt_ids=[1], stop_reason="env_error", error="Env.reset raised KeyError: 'goal'")
    hung = Trajectory(prompt_ids=[1], stop_reason="env_timeout", error="Env.step took longer than env_timeout=1 s")
    everyone = [RoundFailures.of([ok, failed]), RoundFailures.of([hung, failed, ok])]
    assert failure_line("step 4", 5, everyone, " and train nothing") == (
        "step 4: 3 of 5 trajectories failed and train nothing (env_error 2, env_timeout 1); e.g. Env.reset raised "
        "KeyError: 'goal'")
    assert failure_line("step 4", 2, [RoundFailures.of([ok, ok])]) is None
    long = Trajectory(prompt_ids=[1], stop_reason="env_error", error="x" * 10_000 + "\n" * 50)
    assert len(failure_line("step 1", 1, [RoundFailures.of([long])])) < 400  # never a dump


def _sums(count=4, tool_turns=4, calls=0, **stops):
    sums = Counter({"count": count, "tool_turns": tool_turns, "native_tool_calls": calls})
    sums.update({f"stop/{reason}": n for reason, n in (stops or {"terminated": count}).items()})
    return sums


def _health(window, budgets):
    return RunHealth(window, budgets, max_degenerate_steps=3, trajectory_dir=None)


def _warnings(health, sums, metrics):
    """The warnings of a round without failed trajectories or refusals."""
    lines, stop = health.observe("step 1", sums, [], None, False, metrics)
    assert stop is None
    return lines


def test_each_warning_comes_once_after_the_window_and_resets_when_the_run_recovers():
    health = _health(3, "max_completion_length=4, max_tokens_per_turn=4, max_turns=3")
    flat = {"reward": 0.0, "reward_std": 0.0, "frac_reward_zero_std": 1.0}
    assert _warnings(health, _sums(), flat) == [] and _warnings(health, _sums(), flat) == []
    third = _warnings(health, _sums(), flat)
    assert [w.split(" ")[:3] for w in third] == [["every", "group's", "rewards"], ["no", "trajectory", "called"]]
    assert "(all 0)" in third[0] and "SFT" in third[0] and "chat template" in third[1]
    assert _warnings(health, _sums(), flat) == []  # once per run
    cut = _health(2, "max_completion_length=4, max_tokens_per_turn=4, max_turns=3")
    spread = {"reward": 0.5, "reward_std": 0.5, "frac_reward_zero_std": 0.0}
    assert _warnings(cut, _sums(calls=4, max_tokens=3, env_error=1), spread) == []
    assert _warnings(cut, _sums(calls=4, terminated=4), spread) == []  # the run recovered: the count starts again
    assert _warnings(cut, _sums(calls=4, max_tokens=3, env_error=1), spread) == []
    warnings = _warnings(cut, _sums(calls=4, max_tokens=3, env_error=1), spread)
    assert len(warnings) == 1 and warnings[0].startswith("every trajectory was cut by a budget for 2 rounds in a row "
                                                         "(max_tokens 3)")
    assert "max_completion_length=4, max_tokens_per_turn=4" in warnings[0]


def test_no_warning_without_tools_or_with_a_spread_or_when_everything_failed():
    health = _health(1, "")
    assert _warnings(health, _sums(tool_turns=0), {"reward_std": 0.3, "frac_reward_zero_std": 0.0}) == []
    # every trajectory failed: the failure line and the degenerate-run check speak for that round
    assert _warnings(health, _sums(env_error=4), {"reward_std": 0.0, "frac_reward_zero_std": 1.0}) == []
    assert _warnings(_health(0, ""), _sums(), {"reward_std": 0.0}) == []  # 0: never warn
    one_sample = _warnings(_health(1, ""), _sums(calls=4), {"reward": 1.0, "reward_std": 0.0})  # PPO: no groups
    assert len(one_sample) == 1 and one_sample[0].startswith("every group's rewards were equal (all 1)")


def test_a_round_says_its_failed_trajectories_first_and_warns_in_the_same_read():
    health = _health(1, "")
    failed = Trajectory(prompt_ids=[1], stop_reason="env_error", error="Env.step raised ValueError: bad")
    lines, stop = health.observe("step 2", _sums(calls=4, terminated=3, env_error=1),
                                 [RoundFailures.of([failed])], None, False, {"reward": 1.0, "reward_std": 0.0})
    assert stop is None and len(lines) == 2
    assert lines[0] == ("step 2: 1 of 4 trajectories failed and train nothing (env_error 1); e.g. Env.step raised "
                        "ValueError: bad")
    assert lines[1].startswith("every group's rewards were equal (all 1)")


def test_unscorable_rounds_in_a_row_stop_the_run():
    health = RunHealth(1, "", max_degenerate_steps=2, trajectory_dir="runs/t")
    failed = Trajectory(prompt_ids=[1], stop_reason="env_timeout", error="Env.reset took longer than 1 s")
    everyone = [RoundFailures.of([]), RoundFailures.of([failed])]
    observe = lambda unscorable: health.observe("step 1", _sums(), everyone, None, unscorable, {})[1]  # noqa: E731
    assert observe(True) is None
    assert observe(False) is None  # one scorable completion: the count starts again
    assert observe(True) is None
    assert observe(True) == ("stopped after 2 generation rounds in a row in which no completion could be scored "
                             "(every trajectory ended env_timeout; the first error: Env.reset took longer than 1 s); "
                             "the trajectories are in runs/t/trajectories-rank*.jsonl; max_degenerate_steps=0 turns "
                             "this check off")
    never = RunHealth(1, "", max_degenerate_steps=0, trajectory_dir=None)
    assert never.observe("step 1", _sums(), [], None, True, {})[1] is None


# -- through a training run --------------------------------------------------------------------------------------
@pytest.mark.parametrize("trainer_name", ["grpo", "ppo"])
def test_a_model_that_never_calls_a_tool_is_named_once(qwen, tmp_path, caplog, trainer_name):
    """TRL's tools and a model that only ever answers "Done.": every reward equal, no tool call. The run goes on
    (a warning, not an error) and each cause is named once, after three rounds."""
    from trl import GRPOConfig

    from trl_agentic import AgenticGRPOTrainer, AgenticPPOConfig, AgenticPPOTrainer

    tok = qwen.load_tokenizer()
    model = scripted(qwen.load_model(), tok, ["Done."])
    reward = lambda completions, **k: [0.0] * len(completions)  # noqa: E731
    common = dict(model=model, processing_class=tok, train_dataset=increment_dataset(), reward_funcs=reward,
                  environment_factory=IncrementEnv)
    if trainer_name == "grpo":
        trainer = AgenticGRPOTrainer(**common, args=_config(GRPOConfig, tmp_path, max_steps=4))
    else:
        args = _config(AgenticPPOConfig, tmp_path, rollout_mode="chat", max_tokens_per_turn=96, max_steps=4)
        args.num_generations = 1
        trainer = AgenticPPOTrainer(**common, args=args)
    with caplog.at_level(logging.WARNING, logger=BASE_LOGGER):
        trainer.train()
    assert trainer.state.global_step == 4
    lines = [r.getMessage() for r in caplog.records if r.name == BASE_LOGGER]
    assert sum(line.startswith("every group's rewards were equal (all 0) for 3 rounds") for line in lines) == 1
    assert sum(line.startswith("no trajectory called a tool for 3 rounds") for line in lines) == 1
    assert len(lines) == 2 and all("\n" not in line for line in lines)


def test_a_budget_that_cannot_hold_one_tool_call_is_refused(qwen, tmp_path):
    """Issue 50's run: max_completion_length=4 trained silently with every turn truncated."""
    from trl import GRPOConfig

    from trl_agentic import AgenticGRPOTrainer

    with pytest.raises(ValueError, match=r"^a turn may sample at most 4 tokens, but the shortest tool call this chat "
                                         r"template renders \(increment\(\) without arguments\) takes \d+"):
        AgenticGRPOTrainer(model=qwen.model_dir, reward_funcs=lambda completions, **k: [0.0] * len(completions),
                           args=_config(GRPOConfig, tmp_path, max_completion_length=4), train_dataset=increment_dataset(),
                           environment_factory=IncrementEnv)
    # a budget that holds a call builds
    AgenticGRPOTrainer(model=qwen.model_dir, reward_funcs=lambda completions, **k: [0.0] * len(completions),
                       args=_config(GRPOConfig, tmp_path, max_completion_length=40), train_dataset=increment_dataset(),
                       environment_factory=IncrementEnv)


def test_a_run_whose_every_turn_is_cut_says_which_budget(qwen, tmp_path, caplog):
    """Our text environment and turns the budget always cuts (the model's answers never close): one warning naming
    the stop reason and the budgets."""
    from helpers import EchoEnvironment, ScriptedGenerator, agentic_args, lookup_dataset

    from trl_agentic import AgenticGRPOTrainer
    from trl_agentic.toy import save_tiny_model

    trainer = AgenticGRPOTrainer(model=save_tiny_model(str(tmp_path / "tiny")), reward_funcs=lambda completions, **k:
                                 [float(len(c)) for c in completions], train_dataset=lookup_dataset(8),
                                 args=agentic_args(tmp_path, max_steps=3, max_tokens_per_turn=4, max_completion_length=8,
                                                   max_turns=1), environment=EchoEnvironment)
    tok = trainer.processing_class
    trainer.rollout_seam.engine.generator = ScriptedGenerator(tok, lambda ids: "a long answer that never ends")
    with caplog.at_level(logging.WARNING, logger=BASE_LOGGER):
        trainer.train()
    lines = [r.getMessage() for r in caplog.records if r.name == BASE_LOGGER]
    assert any(line.startswith("every trajectory was cut by a budget for 3 rounds in a row (max_turns 4)")
               and "max_completion_length=8, max_tokens_per_turn=4, max_turns=1" in line for line in lines), lines
