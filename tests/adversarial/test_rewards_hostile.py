"""Rewards that misbehave cost the completion they misbehave on: non-numbers, NaN and inf become unscorable
(None); a function that raises on a batch is retried one completion at a time."""

import math

import pytest

from trl_agentic.rewards import Component, CompositeReward
from trl_agentic.rewards.guard import AsyncGuardedReward, GuardedReward, guard_reward

BAD = ["1.0", float("nan"), float("inf"), -float("inf"), object(), [1.0], None]


def test_bad_values_become_none_and_are_counted():
    metrics = {}

    def reward(prompts, completions, **kwargs):
        return [0.5] + BAD

    guarded = guard_reward(reward)
    assert isinstance(guarded, GuardedReward) and guarded.__name__ == "reward"
    out = guarded(prompts=[""] * 8, completions=[""] * 8, log_metric=metrics.__setitem__)
    assert out == [0.5] + [None] * 7
    assert math.isclose(metrics["agentic/reward_invalid/reward"], 6 / 8)  # None is a legitimate "not applicable"


def test_a_function_that_raises_loses_only_the_rows_it_raises_on():
    def picky(prompts, completions, **kwargs):
        if any(c == "boom" for c in completions):
            raise ValueError("cannot parse")
        return [float(len(c)) for c in completions]

    out = GuardedReward(picky)(prompts=["p"] * 3, completions=["ab", "boom", "abc"], trajectory=[1, 2, 3])
    assert out == [2.0, None, 3.0]


def test_wrong_length_is_a_clear_error():
    with pytest.raises(ValueError, match="one number"):
        GuardedReward(lambda prompts, completions, **k: [1.0])(prompts=["p"] * 2, completions=["a", "b"])


def test_async_rewards_stay_async():
    import asyncio

    async def reward(prompts, completions, **kwargs):
        return [float("nan"), 1.0]

    guarded = guard_reward(reward)
    assert isinstance(guarded, AsyncGuardedReward)
    assert asyncio.run(guarded(prompts=["p", "q"], completions=["a", "b"])) == [None, 1.0]


def test_composite_reward_does_not_propagate_nan_or_inf():
    """Before: a component's NaN made the total NaN (and a string crashed the batch)."""
    logged = {}
    composite = CompositeReward([
        Component("outcome", lambda prompts, completions, **k: [1.0, float("nan"), "x"], outcome=True),
        Component("shaping", lambda prompts, completions, **k: [0.1, 0.2, float("inf")], weight=0.5),
    ])
    totals = composite(prompts=[""] * 3, completions=[""] * 3, log_metric=logged.__setitem__)
    assert totals == [1.05, 0.1, None]
    assert logged["reward/outcome/invalid"] == pytest.approx(2 / 3) and logged["reward/shaping/invalid"] == pytest.approx(1 / 3)


def test_trainer_turns_bad_rewards_into_unscorable_rows(tiny_model_dir, tokenizer, tmp_path):
    from helpers import EchoEnvironment, agentic_args, lookup_dataset

    from trl_agentic import AgenticGRPOTrainer

    def nan_for_some(completions, trajectory, **kwargs):
        return [float("nan") if i % 2 else float(t.num_agent_tokens) for i, t in enumerate(trajectory)]

    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=nan_for_some, args=agentic_args(tmp_path),
                                 train_dataset=lookup_dataset(8), processing_class=tokenizer,
                                 environment=lambda: EchoEnvironment(turns=1))
    trainer.model.train()
    round_ = trainer.generation_round([trainer.train_dataset[i] for i in range(4)])
    assert round_.rewards_per_func[1::2].isnan().all() and not round_.rewards_per_func[0::2].isnan().any()
    batch = trainer.training_batch([trainer.train_dataset[i] for i in range(4)])
    assert batch.advantages[1::2].eq(0).all()


def test_garbage_configuration_gives_one_line_errors(tokenizer, tmp_path):
    from helpers import EchoEnvironment, ScriptedGenerator

    from trl_agentic import RolloutConfig
    from trl_agentic.rollout.engine import RolloutEngine

    with pytest.raises(ValueError, match="max_turns must be an integer >= 1, got '3'"):
        RolloutConfig(max_turns="3")
    with pytest.raises(TypeError, match=r"stop_strings is the string .* write \["):
        RolloutConfig(stop_strings="</search>")
    with pytest.raises(ValueError, match="env_timeout"):
        RolloutConfig(env_timeout=-1)
    gen = ScriptedGenerator(tokenizer, lambda ids: "act")
    with pytest.raises(TypeError, match="environment must be an Environment class or a zero-argument factory"):
        RolloutEngine(gen, tokenizer, "search", RolloutConfig())
    with pytest.raises(TypeError, match="config must be a RolloutConfig"):
        RolloutEngine(gen, tokenizer, EchoEnvironment, {"max_turns": 2})
    from helpers import agentic_args

    with pytest.raises(ValueError, match="rollout_mode must be 'text' or 'chat'"):
        agentic_args(tmp_path, rollout_mode="json")


def test_evaluation_cleans_rewards_as_training_does(tokenizer):
    """Evaluation scores through the guard training uses (``rewards/guard.guard_reward``): an infinite or NaN reward
    is unscorable, and a reward function that raises on one completion costs that completion, not the evaluation.
    Before: ``inf`` was reported as a reward (and made ``mean_reward`` infinite), and a raise ended the evaluation."""
    from helpers import even_rows_right

    from trl_agentic.evaluate import evaluate
    from trl_agentic.toy import LookupEnvironment, lookup_reward, make_lookup_dataset

    rows = make_lookup_dataset(4, seed=1)
    keys = [row["key"] for row in rows]

    def hostile(completions, key, **kwargs):
        if keys[2] in key:  # raises on any batch that holds row 2's completion
            raise ValueError("cannot parse row 2")
        scores = lookup_reward(completions=completions, **kwargs)
        return [float("inf") if k == keys[1] else float("nan") if k == keys[3] else s for k, s in zip(key, scores)]

    report, trajectories = evaluate(None, tokenizer, LookupEnvironment, rows, hostile, samples_per_row=1,
                                    generator=even_rows_right(tokenizer, rows), batch_size=4, max_turns=3,
                                    max_completion_length=60, show_progress=False)
    assert len(trajectories) == 4
    assert report.rewards == [1.0, None, None, None]
    assert report.successes == [1, 0, 0, 0] and report.mean_reward == 1.0


def test_reward_messages_name_the_type_the_function_and_one_example(caplog):
    """Issue 50: a reward of strings said "not finite numbers" without saying they were strings."""
    import logging

    with caplog.at_level(logging.WARNING, logger="trl_agentic.rewards.guard"):
        GuardedReward(lambda completions, **k: ["1.0"] * len(completions))(completions=["a", "b", "c"])
        GuardedReward(lambda completions, **k: [float("nan"), None, {"r": 1}])(completions=["a", "b", "c"])
    first, second = (r.getMessage() for r in caplog.records)
    assert first == ("reward function '<lambda>' returned 3 of 3 values that are not finite numbers (str; e.g. "
                     "'1.0'): each counts as unscorable (None); return a float per completion (None skips one)")
    assert second.startswith("reward function '<lambda>' returned 2 of 3 values that are not finite numbers (nan x1, "
                             "dict x1; e.g. nan)")


def test_a_composite_component_that_returns_text_is_named(caplog):
    import logging

    reward = CompositeReward([Component("em", lambda completions, **k: ["0.5"] * len(completions), 1.0, outcome=True),
                              Component("fmt", lambda completions, **k: [0.1] * len(completions), 0.5)])
    with caplog.at_level(logging.WARNING, logger="trl_agentic.rewards.composite"):
        assert reward(prompts=["p"] * 2, completions=["a", "b"]) == pytest.approx([0.05, 0.05])
    assert [r.getMessage() for r in caplog.records] == [
        "composite component 'em' returned 2 of 2 values that are not finite numbers (str; e.g. '0.5'): each counts "
        "as unscorable (None); return a float per completion (None skips one)"]


@pytest.mark.parametrize("reward_name", ["qa", "math", "search_r1", "format"])
def test_library_rewards_score_non_text_completions_zero_in_one_line(caplog, reward_name):
    """Issue 50: the math and QA rewards raised bare TypeError/AttributeError on a list, a dict or None."""
    import logging

    from trl_agentic.rewards import FormatReward, MathAnswerReward, QAReward, SearchR1Reward

    reward = {"qa": QAReward, "math": MathAnswerReward, "search_r1": SearchR1Reward, "format": FormatReward}[reward_name]()
    completions = ["<answer>4</answer>", [12, 13], {"content": "4"}, None, [{"role": "assistant", "content": "4"}]]
    with caplog.at_level(logging.WARNING, logger="trl_agentic.rewards.base"):
        out = reward(prompts=["p"] * 5, completions=completions, golden_answers=[["4"]] * 5, answer=["4"] * 5,
                     solution=["4"] * 5)
    assert out[1:4] == [0.0, 0.0, 0.0]
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == (f"{reward.__name__} scored 3 of 5 completions 0.0: they are not text or a list of messages "
                    "(NoneType, dict, list; e.g. [12, 13])")
