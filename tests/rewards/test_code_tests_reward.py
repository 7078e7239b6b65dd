import pickle

import pytest

from trl_agentic.rewards import CodeTestsReward, extract_program
from trl_agentic.tools import PythonSandbox

PROGRAM = "def add(a, b):\n    return a + b\n"
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add('a', 'b') == 'ab'"]


def test_extract_program():
    assert extract_program("<think>x</think><answer>```python\ndef f(): pass\n```</answer>") == "def f(): pass"
    text = "draft:\n```python\nx = 1\n```\nfinal:\n```py\nx = 2\n```\n"
    assert extract_program(text) == "x = 2"
    assert extract_program("<code>print(1)</code>") == "print(1)"
    assert extract_program("no code here", sources=("answer", "code")) is None
    with pytest.raises(ValueError):
        extract_program("", sources=("diff",))


@pytest.fixture(scope="module")
def sandbox():
    sandbox = PythonSandbox(timeout=3, pool_size=2)
    yield sandbox
    sandbox.close()


def test_pass_rate(sandbox):
    reward = CodeTestsReward(sandbox=sandbox)
    buggy = PROGRAM.replace("a + b", "a + b if isinstance(a, str) else a - b")
    completions = [
        f"<think>easy</think><answer>```python\n{PROGRAM}```</answer>",
        f"<answer>{buggy}</answer>",  # passes only the string test
        "<answer>def add(a, b): raise ValueError</answer>",
        "<answer>this is not python(</answer>",  # the program itself fails
        "I cannot do it",  # no program
    ]
    rewards = reward(prompts=["q"] * 5, completions=completions, tests=[TESTS] * 5)
    assert rewards == pytest.approx([1.0, 1 / 3, 0.0, 0.0, 0.0])
    strict = CodeTestsReward(sandbox=sandbox, all_or_nothing=True)
    assert strict(prompts=["q"] * 2, completions=completions[:2], tests=[TESTS] * 2) == [1.0, 0.0]


def test_program_in_observation_does_not_count_and_timeouts_fail(sandbox):
    reward = CodeTestsReward(sandbox=sandbox, sources=("answer",))
    in_observation = f"<code>print(1)</code><interpreter><answer>{PROGRAM}</answer></interpreter>"
    hangs = "<answer>def add(a, b):\n    while True:\n        pass\n</answer>"
    rewards = reward(prompts=["q"] * 2, completions=[in_observation, hangs],
                     test_list=[TESTS, ["assert add(1, 2) == 3"]])
    assert rewards == [0.0, 0.0]


def test_single_test_program_and_rows_without_tests(sandbox):
    reward = CodeTestsReward(sandbox=sandbox)
    check = "def check(candidate):\n    assert candidate(2, 3) == 5\n\ncheck(add)\n"
    rewards = reward(prompts=["q"] * 2, completions=[f"<answer>{PROGRAM}</answer>"] * 2, test=[check, []])
    assert rewards == [1.0, None]


def test_owned_sandbox_is_created_lazily_and_pickles():
    reward = CodeTestsReward(sandbox_kwargs={"timeout": 3, "pool_size": 0})
    try:
        assert reward(prompts=["q"], completions=[f"<answer>{PROGRAM}</answer>"], tests=[TESTS[:1]]) == [1.0]
        clone = pickle.loads(pickle.dumps(reward))
        assert clone._sandbox is None
    finally:
        reward.close()
    assert reward._sandbox is None


def test_a_sandbox_that_cannot_keep_tests_apart_is_refused():
    class RemoteSandbox:
        def session(self):
            raise AssertionError("never used")

    with pytest.raises(TypeError, match="PythonSandbox"):
        CodeTestsReward(sandbox=RemoteSandbox())
