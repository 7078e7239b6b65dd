"""Rewards that misbehave cost the completion they misbehave on: non-numbers, NaN and inf become unscorable
(None); a function that raises on a batch is retried one completion at a time."""

import math

import numpy as np
import pytest
import torch

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


# -- what a reward function returns (issue 58) ---------------------------------------------------------------------

VALUES = [2.0, 0.0, 0.0, 2.0]
RETURNS = {  # every one TRL's GRPOTrainer trains with: its _calculate_rewards iterates the return
    "list": list,
    "tuple": tuple,
    "numpy array": lambda v: np.array(v),
    "numpy float32 array": lambda v: np.array(v, dtype=np.float32),
    "tensor": lambda v: torch.tensor(v),
    "tensor that requires grad": lambda v: torch.tensor(v, requires_grad=True),
    "generator": lambda v: (x for x in v),
    "dict values": lambda v: dict(enumerate(v)).values(),
}


@pytest.mark.parametrize("kind", list(RETURNS))
def test_rewards_are_taken_in_any_sequence_trl_takes(kind):
    """Before: a numpy array, a tensor or a generator stopped training ("... it must return a list")."""
    make = RETURNS[kind]
    out = GuardedReward(lambda completions, **k: make(VALUES))(completions=["a", "b", "c", "d"])
    assert out == VALUES and all(type(v) is float for v in out)


@pytest.mark.parametrize("kind", ["numpy array", "tensor", "generator"])
def test_sequences_keep_their_bad_values_per_completion(kind):
    out = GuardedReward(lambda completions, **k: RETURNS[kind]([1.0, float("nan"), float("inf"), 0.5]))(
        completions=["a", "b", "c", "d"])
    assert out == [1.0, None, None, 0.5]


def test_an_async_reward_may_return_a_tensor():
    import asyncio

    async def reward(completions, **kwargs):
        return torch.tensor(VALUES)

    assert asyncio.run(guard_reward(reward)(completions=["a", "b", "c", "d"])) == VALUES


def test_a_retried_row_may_return_an_array():
    """A function that raises on a batch is retried one completion at a time; each row's one-element array (or
    generator) is its value. Before, only a one-element list counted."""
    def picky(completions, **kwargs):
        if len(completions) > 1:
            raise ValueError("one at a time, please")
        return np.array([len(completions[0])], dtype=np.int64)

    assert GuardedReward(picky)(completions=["ab", "abc"]) == [2.0, 3.0]


def test_a_generator_that_raises_is_retried_one_completion_at_a_time():
    def reward(completions, **kwargs):
        return (1.0 / (len(c) - 1) for c in completions)  # its code runs when it is read: "b" divides by zero

    assert GuardedReward(reward)(completions=["ab", "b", "abc"]) == [1.0, None, 0.5]


REFUSED = {  # TRL cannot read them, or reads them wrongly
    "None (a forgotten return)": (None, "returned None for 4 completions"),
    "a number": (2.0, "returned 2.0 for 4"),
    "a 0-d array": (np.array(2.0), "returned array(2.) for 4"),
    "a 0-d tensor": (torch.tensor(2.0), "returned tensor(2.) for 4"),
    "a string of 4 characters": ("2002", "returned '2002' for 4"),
    "a mapping (TRL reads its keys)": ({"a": 1.0, "b": 0.0, "c": 1.0, "d": 0.0}, "returned {'a': 1.0"),
    "a set (no order)": ({1.0, 2.0, 3.0, 4.0}, "returned {1.0"),
    "three values": (np.array([1.0, 2.0, 3.0]), "returned 3 values for 4 completions"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_return_that_is_not_one_value_per_completion_is_a_one_line_error(name):
    value, said = REFUSED[name]
    with pytest.raises(ValueError) as info:
        GuardedReward(lambda completions, **k: value)(completions=["a", "b", "c", "d"])
    message = str(info.value)
    assert message.startswith(f"reward function '<lambda>' {said}") and "\n" not in message
    assert message.endswith("return one number (or None) per completion, in a list, a tuple, a numpy array or a tensor")


@pytest.mark.parametrize("kind", ["numpy array", "tensor", "generator"])
def test_a_composite_component_may_return_any_sequence_trl_takes(kind):
    reward = CompositeReward([Component("em", lambda completions, **k: RETURNS[kind](VALUES), outcome=True),
                              Component("fmt", lambda completions, **k: [0.5] * len(completions), 0.5)])
    assert reward(prompts=["p"] * 4, completions=["a", "b", "c", "d"]) == [2.25, 0.25, 0.25, 2.25]


def _forgot_return(completions, **kwargs):
    [0.5 for _ in completions]  # noqa: B018 - the bug: no return


BROKEN = {
    "None (a forgotten return)": (_forgot_return, "composite component 'fmt' returned None for 3 completions"),
    "a number": (lambda completions, **k: 0.5, "composite component 'fmt' returned 0.5 for 3 completions"),
    "one value too few": (lambda completions, **k: np.ones(len(completions) - 1),
                          "composite component 'fmt' returned 2 values for 3 completions"),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_composite_component_with_a_bad_return_is_named(name):
    """Before: ``TypeError: object of type 'NoneType' has no len()``, which named no component."""
    func, said = BROKEN[name]
    reward = CompositeReward([Component("em", lambda completions, **k: [1.0] * len(completions), outcome=True),
                              Component("fmt", func, 0.5)])
    with pytest.raises(ValueError) as info:
        reward(prompts=["p"] * 3, completions=["a", "b", "c"])
    assert str(info.value).startswith(said) and "\n" not in str(info.value)


def test_a_bad_component_return_costs_what_a_raising_component_costs(caplog):
    """Under the guard our trainers put on every reward function, a component whose return is not one value per
    completion costs what a component that raises costs: the batch is scored one completion at a time, and a
    completion it fails on is unscorable; the one warning line names the component."""
    import logging

    def raising(completions, **kwargs):
        raise ValueError("component 'fmt' broke")

    def composite(fmt):
        return CompositeReward([Component("em", lambda completions, **k: [1.0] * len(completions), outcome=True),
                                Component("fmt", fmt, 0.5)])

    completions = ["a", "b", "c"]
    with caplog.at_level(logging.WARNING, logger="trl_agentic.rewards.guard"):
        broken = GuardedReward(composite(_forgot_return))(prompts=["p"] * 3, completions=completions)
        raised = GuardedReward(composite(raising))(prompts=["p"] * 3, completions=completions)
    assert broken == raised == [None, None, None]
    assert [r.getMessage() for r in caplog.records][0] == (
        "reward function 'composite_reward' raised ValueError: composite component 'fmt' returned None for 3 "
        "completions; return one number (or None) per completion, in a list, a tuple, a numpy array or a tensor; "
        "scoring one completion at a time")
    # a component that returns too few values for a batch but one for one completion costs nothing
    short = composite(lambda completions, **k: [0.5])
    assert GuardedReward(short)(prompts=["p"] * 3, completions=completions) == [1.25, 1.25, 1.25]


def test_training_takes_an_array_reward_and_names_a_broken_component(tiny_model_dir, tokenizer, tmp_path, caplog):
    """Issue 58 in a trainer: a reward function returning a numpy array trains as under TRL (before: ValueError,
    the run stopped); a composite whose component forgot its ``return`` leaves its completions unscorable, in one
    warning line naming the component (before: ``TypeError ... has no len()``, no name)."""
    import logging

    from helpers import EchoEnvironment, agentic_args, lookup_dataset

    from trl_agentic import AgenticGRPOTrainer

    def as_array(completions, trajectory, **kwargs):
        return np.array([float(t.num_agent_tokens) for t in trajectory])

    broken = CompositeReward([Component("fmt", _forgot_return, outcome=True)], name="broken_composite")
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=[as_array, broken], args=agentic_args(tmp_path),
                                 train_dataset=lookup_dataset(8), processing_class=tokenizer,
                                 environment=lambda: EchoEnvironment(turns=1))
    trainer.model.train()
    with caplog.at_level(logging.WARNING, logger="trl_agentic.rewards.guard"):
        round_ = trainer.generation_round([trainer.train_dataset[i] for i in range(4)])
    tokens = torch.tensor([float(t.num_agent_tokens) for t in round_.runs])
    assert torch.equal(round_.run_rewards[:, 0].cpu(), tokens)
    assert round_.run_rewards[:, 1].isnan().all()
    (line,) = [r.getMessage() for r in caplog.records]
    assert "reward function 'broken_composite' raised ValueError: composite component 'fmt' returned None" in line
