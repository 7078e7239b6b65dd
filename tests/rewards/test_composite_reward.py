import pickle
import warnings
from types import SimpleNamespace

import pytest

from trl_agentic.rewards import (
    Component,
    CompositeReward,
    FormatReward,
    LengthPenalty,
    LinearSchedule,
    QAReward,
    ToolUseReward,
    progressive_reward,
)


class Counting:
    """A reward function returning fixed values and counting its calls."""

    def __init__(self, values, name):
        self.values, self.calls, self.__name__ = values, 0, name

    def __call__(self, prompts, completions, **kwargs):
        self.calls += 1
        return list(self.values)


def state(step, max_steps=100):
    return SimpleNamespace(global_step=step, max_steps=max_steps)


def test_weighted_total_caps_and_single_evaluation(recorder):
    outcome = Counting([1.0, 0.0, None], "em")
    shaping = Counting([3.0, -3.0, None], "fmt")
    reward = CompositeReward([
        Component("outcome", outcome, weight=1.0, outcome=True),
        Component("format", shaping, weight=0.5, clip=(-1.0, 1.0)),
    ])
    totals = reward(prompts=["q"] * 3, completions=["a", "b", "c"], trainer_state=state(0),
                    log_metric=recorder.log_metric, log_extra=recorder.log_extra)
    assert totals == [1.5, -0.5, None]  # None only when every component is
    assert (outcome.calls, shaping.calls) == (1, 1)
    assert recorder.metrics["reward/outcome"] == [0.5]
    assert recorder.metrics["reward/format"] == [0.0]  # capped values: 1 and -1
    assert recorder.metrics["reward/total"] == [0.5]
    assert "reward/format/weight" not in recorder.metrics  # constant weights are not logged
    assert recorder.extra["reward/format"] == [1.0, -1.0, None]
    assert reward.__name__ == "composite_reward"


def test_scheduled_weights_follow_the_step(recorder):
    reward = CompositeReward([
        Component("outcome", Counting([1.0], "o"), outcome=True),
        Component("shaping", Counting([1.0], "s"), weight=LinearSchedule(0.5, 0.0)),
    ])
    assert reward.weights(50, 100) == {"outcome": 1.0, "shaping": 0.25}
    for step, expected in [(0, 1.5), (50, 1.25), (100, 1.0)]:
        assert reward(prompts=["q"], completions=["a"], trainer_state=state(step),
                      log_metric=recorder.log_metric) == [expected]
    assert recorder.metrics["reward/shaping/weight"] == [0.5, 0.25, 0.0]


def test_warns_once_when_shaping_outweighs_outcome():
    reward = CompositeReward([
        Component("outcome", Counting([1.0], "o"), weight=1.0, outcome=True),
        Component("format", Counting([1.0], "f"), weight=0.6),
        Component("tools", Counting([1.0], "t"), weight=-0.6),
    ])
    with pytest.warns(UserWarning, match="outweigh"):
        reward(prompts=["q"], completions=["a"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reward(prompts=["q"], completions=["a"])  # only once
    balanced = CompositeReward([Component("o", Counting([1.0], "o"), outcome=True),
                                Component("f", Counting([1.0], "f"), weight=1.0)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        balanced(prompts=["q"], completions=["a"])


def test_validation():
    with pytest.raises(ValueError):
        CompositeReward([])
    with pytest.raises(ValueError, match="unique"):
        CompositeReward([Component("a", Counting([1.0], "x")), Component("a", Counting([1.0], "y"))])
    bad = CompositeReward([Component("a", Counting([1.0, 2.0], "x"), outcome=True)])
    with pytest.raises(ValueError, match="returned 2"):
        bad(prompts=["q"], completions=["a"])


def test_real_components_with_trajectories(trajectory, recorder):
    traj = trajectory(
        ["<think>need data</think><search>capital of France</search>", "<think>Paris</think><answer>Paris</answer>"],
        ["\n\n<information>Doc 1 Paris</information>\n\n", None],
        turn_infos=[{"tool": ["search"]}, {"answer": "Paris"}],
        agent_tokens=30, observation_tokens=400,
    )
    reward = CompositeReward([
        Component("em", QAReward(), weight=1.0, outcome=True),
        Component("format", FormatReward(), weight=0.2),
        Component("tools", ToolUseReward(required_tools={"search"}), weight=0.2, clip=(-0.2, 0.2)),
        Component("length", LengthPenalty.overlong(max_length=64, cache_length=32), weight=0.1),
    ])
    assert reward(prompts=["q"], completions=["ignored"], golden_answers=[["Paris"]], trajectory=[traj],
                  log_metric=recorder.log_metric) == [pytest.approx(1.0 + 0.2 + 0.2 * 0.2 + 0.0)]
    assert set(recorder.metrics) == {"reward/em", "reward/format", "reward/tools", "reward/length", "reward/total"}


def test_progressive_reward(trajectory):
    outcome = Counting([1.0], "outcome")
    reward = progressive_reward(outcome)
    traj = [trajectory(["a", "b"], turn_rewards=[0.2, 0.4])]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # early shaping dominance is by design: no warning
        values = [reward(prompts=["q"], completions=["x"], trajectory=traj, trainer_state=state(s))[0]
                  for s in (0, 50, 100)]
    assert values == pytest.approx([0.3, 0.5 * 1.0 + 0.5 * 0.3, 1.0])


def test_picklable():
    reward = CompositeReward([Component("em", QAReward(), outcome=True),
                              Component("format", FormatReward(), weight=LinearSchedule(0.5, 0.0))])
    clone = pickle.loads(pickle.dumps(reward))
    assert clone(prompts=["q"], completions=["<think>a</think><answer>x</answer>"], golden_answers=[["x"]]) == [1.5]
    pickle.dumps(LengthPenalty.overlong(10, 5))


@pytest.mark.parametrize("weight", [float("nan"), float("inf"), -float("inf"), "0.5", None])
def test_non_finite_weight_is_refused(weight):
    with pytest.raises(ValueError, match="component 'em': weight must be finite numbers"):
        CompositeReward([Component("em", Counting([1.0], "em"), weight)])


@pytest.mark.parametrize("schedule", [lambda: LinearSchedule(start=float("nan")),
                                      lambda: LinearSchedule(end=float("inf"))])
def test_non_finite_schedule_is_refused(schedule):
    with pytest.raises(ValueError, match="must be finite numbers"):
        schedule()
