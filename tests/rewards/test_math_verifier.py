import threading
import time

import pytest

from trl_agentic.rewards import MathAnswerReward, extract_answer, extract_gold, math_equal
from trl_agentic.rewards.verifiers import math_answer

pytest.importorskip("math_verify")

GSM8K_GOLD = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether she sold 48+24 = <<48+24=72>>72 clips.\n#### 72"


@pytest.mark.parametrize(
    ("prediction", "gold"),
    [
        ("1,000", "1000"),
        ("1000", "1,000"),
        ("1,000,000", "1000000"),
        ("0.5", "1/2"),
        ("$18.00", "18"),
        ("\\$18.00", "18"),
        ("18 dollars", "18"),
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\frac{1}{2}", "0.5"),
        ("\\dfrac{3}{4}", "0.75"),
        ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}"),
        ("72", GSM8K_GOLD),
        ("The answer is 72.", "#### 72"),
        ("5%", "0.05"),
        ("2^{10}", "1024"),
        ("x^2+1", "1+x^2"),
        ("18", 18),
    ],
)
def test_math_equal_equivalent(prediction, gold):
    assert math_equal(prediction, gold)


@pytest.mark.parametrize(
    ("prediction", "gold"),
    [("12", "120"), ("-3", "3"), ("1/3", "0.5"), ("Beijing", "18"), ("", "18"), (None, "18"), ("73", GSM8K_GOLD),
     ("2", "2^{10}"), ("2^{10}", "2")],
)
def test_math_equal_different(prediction, gold):
    assert not math_equal(prediction, gold)


def test_extract_gold():
    assert extract_gold(GSM8K_GOLD) == "72"
    assert extract_gold(" \\frac{1}{2} ") == "\\frac{1}{2}"


def test_extract_answer_order_and_strict_modes():
    text = "<think>2+2 is \\boxed{3}? no</think> so 7 <answer>4</answer> then 9"
    assert extract_answer(text) == "4"
    assert extract_answer("first \\boxed{\\frac{1}{2}} then \\boxed{\\frac{3}{4}} 11") == "\\frac{3}{4}"
    assert extract_answer("costs 1,000 or 2,500 dollars") == "2,500"
    assert extract_answer("<answer>1</answer> <answer>2</answer>") == "2"
    assert extract_answer("the result is 5", sources=("answer",)) is None
    assert extract_answer("\\boxed{5} 6", sources=("answer", "boxed")) == "5"
    assert extract_answer("no numbers here") is None
    with pytest.raises(ValueError, match="unknown answer sources"):
        extract_answer("x", sources=("last_line",))


def test_reward_text_completions():
    reward = MathAnswerReward()
    completions = [
        "<think>48/2=24, 48+24=72</think><answer>72</answer>",
        "<think>...</think><answer>\\boxed{72.0}</answer>",
        "<think>...</think><answer>71</answer>",
        "I think it is 72",
        "no idea",
    ]
    rewards = reward(prompts=["q"] * 5, completions=completions, answer=[GSM8K_GOLD] * 5)
    assert rewards == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert reward.__name__ == "math_answer"


def test_strict_mode_and_custom_rewards():
    reward = MathAnswerReward(sources=("answer",), correct_reward=1.0, wrong_reward=-1.0)
    rewards = reward(prompts=["q", "q"], completions=["it is 72", "<answer>72</answer>"], answer=["72", "72"])
    assert rewards == [-1.0, 1.0]


def test_answer_inside_observation_does_not_count(trajectory):
    reward = MathAnswerReward(sources=("answer",))
    text = "<code>print(72)</code>\n<interpreter><answer>72</answer></interpreter>\nHmm."
    assert reward(prompts=["q"], completions=[text], answer=["72"]) == [0.0]
    # With a trajectory only the actions count, even if the completion text has the answer in an observation.
    traj = trajectory(["<code>print(72)</code>", "Hmm."], ["<interpreter><answer>72</answer></interpreter>", None])
    assert reward(prompts=["q"], completions=[text], answer=["72"], trajectory=[traj]) == [0.0]
    traj = trajectory(["<code>print(72)</code>", "<answer>72</answer>"], ["<interpreter>72</interpreter>", None])
    assert reward(prompts=["q"], completions=["ignored"], answer=["72"], trajectory=[traj]) == [1.0]


def test_unclosed_observation_is_not_read():
    reward = MathAnswerReward()
    assert reward(prompts=["q"], completions=["<answer>3</answer><information>ans 72 <answer>72</answer>"],
                  answer=["72"]) == [0.0]


def test_conversational_completions_and_gold_lists():
    reward = MathAnswerReward(answer_column=("solution", "answer"))
    completions = [[{"role": "assistant", "content": "<answer>0.5</answer>"}],
                   [{"role": "assistant", "content": "<answer>2</answer>"}]]
    rewards = reward(prompts=[[{"role": "user", "content": "q"}]] * 2, completions=completions,
                     answer=[["1/2", "50%"], ["3", "4"]])
    assert rewards == [1.0, 0.0]


def test_missing_column_is_a_clear_error():
    with pytest.raises(KeyError, match="available columns"):
        MathAnswerReward()(prompts=["q"], completions=["<answer>1</answer>"], solution=["1"])


def test_errors_give_false():
    # the check as the verifier process runs it: whatever math-verify raises scores 0
    assert math_answer.check_equal("1", None, 5) is False  # an exception inside math-verify


def test_verifier_failures_give_false(monkeypatch):
    class Broken:
        def call(self, *args, timeout):
            raise math_answer.WorkerFailed("the worker exited (status -9)")

    monkeypatch.setattr(math_answer, "_verifiers", lambda: Broken())
    assert math_equal("1", "1") is False


def test_works_off_the_main_thread():
    # math-verify's own timeout uses signal.alarm, which raises off the main thread; math_equal must still work.
    results = []
    worker = threading.Thread(target=lambda: results.append((math_equal("1,000", "1000"), math_equal("2", "3"))))
    worker.start()
    worker.join()
    assert results == [(True, False)]


def test_timeout_on_the_main_thread():
    # A real hang: comparing two power towers; math-verify's alarm or the verifier's deadline stops it.
    start = time.perf_counter()
    assert math_equal("9^{9^{9^{8}}}", "9^{9^{9^{9}}}", timeout_seconds=1) is False
    assert time.perf_counter() - start < 5
    assert math_equal("1/2", "0.5")  # the verifiers still work afterwards


def test_timeout_exception_is_caught(monkeypatch):
    from math_verify.errors import TimeoutException

    def timed_out(*args, **kwargs):
        raise TimeoutException("Operation timed out!")

    monkeypatch.setattr(math_answer._math_verify(), "parse", timed_out)
    assert math_answer._equal("1", "1", 5) is False
