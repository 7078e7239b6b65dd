"""Coding tasks for command-line agents: tiny Python repositories, each a module with one bug and a unittest file
that fails on it; the reward is whether the tests pass in the directory the agent left (:class:`TestsPass`).

The repositories are generated deterministically (:func:`coding_tasks`): :data:`FAMILIES` bugs (an operator, an
off-by-one, a comparison, a swapped pair...), each in as many variants as asked (other names and numbers), so
``coding_tasks(12)`` is the same twelve rows on every machine and task ``k`` of a larger set is the same task.

A row: ``prompt`` (the task as one user message: TRL's column; the CLI reads ``task``), ``task`` (the text the CLI
is given), ``files`` (the repository, ``[{"path", "content"}]``: what :class:`~trl_agentic.cli_agents.CLIAgent`
writes in its working directory), ``tests`` (the test files, written again over whatever the agent left before
they are run: editing the tests does not pass them) and ``test_module`` (what ``python -m unittest`` runs).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..cli_agents import CLIResult, CLIRunError
from ..cli_agents.launch import PYTHON, run_command
from ..cli_agents.workspace import write_files
from ..rewards.base import RewardFunction, Sample

TEMPLATE = ("The tests in {test}.py fail. Fix {module}.py so that `python -m unittest {test}` passes; do not change "
            "the tests.")


def _operator(k: int) -> tuple[str, str, tuple[str, str], str]:
    a, b = 3 + k, 5 + 2 * k
    source = "def add(a, b):\n    \"\"\"The sum of a and b.\"\"\"\n    return a - b\n"
    tests = f"self.assertEqual(add({a}, {b}), {a + b})\nself.assertEqual(add(0, {b}), {b})"
    return "arith", source, ("a - b", "a + b"), tests


def _off_by_one(k: int) -> tuple[str, str, tuple[str, str], str]:
    n = 4 + k
    source = ("def count_up(n):\n    \"\"\"The numbers 1 to n, n included.\"\"\"\n"
              "    return list(range(1, n))\n")
    tests = f"self.assertEqual(count_up({n}), {list(range(1, n + 1))})\nself.assertEqual(count_up(1), [1])"
    return "counting", source, ("range(1, n)", "range(1, n + 1)"), tests


def _parity(k: int) -> tuple[str, str, tuple[str, str], str]:
    even, odd = 2 * (k + 2), 2 * (k + 2) + 1
    source = "def is_even(n):\n    \"\"\"Whether n is even.\"\"\"\n    return n % 2 == 1\n"
    tests = f"self.assertTrue(is_even({even}))\nself.assertFalse(is_even({odd}))"
    return "parity", source, ("== 1", "== 0"), tests


def _maximum(k: int) -> tuple[str, str, tuple[str, str], str]:
    values = [k + 7, k + 2, k + 9, k + 1]
    source = "def largest(values):\n    \"\"\"The largest of values.\"\"\"\n    return min(values)\n"
    tests = f"self.assertEqual(largest({values}), {max(values)})"
    return "extremes", source, ("min(", "max("), tests


def _words(k: int) -> tuple[str, str, tuple[str, str], str]:
    words = ["red", "green", "blue", "amber", "teal"][k % 5:] + ["sky"]
    text = " ".join(words)
    source = ("def reverse_words(text):\n    \"\"\"The words of text in reverse order, one space apart.\"\"\"\n"
              "    return text[::-1]\n")
    tests = f"self.assertEqual(reverse_words({text!r}), {' '.join(reversed(words))!r})"
    return "wording", source, ("text[::-1]", "' '.join(reversed(text.split()))"), tests


def _clamp(k: int) -> tuple[str, str, tuple[str, str], str]:
    lo, hi = k, k + 10
    source = ("def clamp(x, lo, hi):\n    \"\"\"x kept between lo and hi.\"\"\"\n"
              "    return max(hi, min(lo, x))\n")
    tests = (f"self.assertEqual(clamp({hi + 5}, {lo}, {hi}), {hi})\nself.assertEqual(clamp({lo - 5}, {lo}, {hi}), "
             f"{lo})\nself.assertEqual(clamp({lo + 3}, {lo}, {hi}), {lo + 3})")
    return "bounds", source, ("max(hi, min(lo, x))", "max(lo, min(hi, x))"), tests


def _average(k: int) -> tuple[str, str, tuple[str, str], str]:
    values = [2 * (k + 1), 4 * (k + 1), 6 * (k + 1)]
    source = ("def mean(values):\n    \"\"\"The arithmetic mean of values.\"\"\"\n"
              "    return sum(values) / (len(values) + 1)\n")
    tests = f"self.assertEqual(mean({values}), {sum(values) / len(values)!r})"
    return "stats", source, ("(len(values) + 1)", "len(values)"), tests


def _fizzbuzz(k: int) -> tuple[str, str, tuple[str, str], str]:
    n = 15 * (k + 1)
    source = ("def fizzbuzz(n):\n    \"\"\"'FizzBuzz' for multiples of 15, 'Fizz' of 3, 'Buzz' of 5, else str(n).\"\"\"\n"
              "    if n % 3 == 0:\n        return 'Fizz'\n    if n % 5 == 0:\n        return 'Buzz'\n"
              "    if n % 15 == 0:\n        return 'FizzBuzz'\n    return str(n)\n")
    tests = f"self.assertEqual(fizzbuzz({n}), 'FizzBuzz')\nself.assertEqual(fizzbuzz(9), 'Fizz')"
    return "game", source, ("if n % 3 == 0:", "if n % 15 == 0:\n        return 'FizzBuzz'\n    if n % 3 == 0:"), tests


Family = Callable[[int], tuple[str, str, tuple[str, str], str]]
FAMILIES: tuple[Family, ...] = (_operator, _off_by_one, _parity, _maximum, _words, _clamp, _average, _fizzbuzz)
"""Each bug: variant ``k`` -> (module name, buggy source, (the bug, its fix) as text, the test method's body)."""


def _repository(index: int) -> tuple[str, str, tuple[str, str], str]:
    """Task ``index``'s module name (the family's, then the variant's number from the second variant on), buggy
    source, (bug, fix) and test body: family ``index % len(FAMILIES)``, variant ``index // len(FAMILIES)``."""
    variant = index // len(FAMILIES)
    stem, source, fix, body = FAMILIES[index % len(FAMILIES)](variant)
    return f"{stem}{variant or ''}", source, fix, body


def coding_task(index: int) -> dict[str, Any]:
    """The row of task ``index`` (module docstring)."""
    module, source, _, body = _repository(index)
    test = f"test_{module}"
    function = source.split("def ", 1)[1].split("(", 1)[0]
    test_source = (f"import unittest\n\nfrom {module} import {function}\n\n\nclass Test(unittest.TestCase):\n"
                   f"    def test_{function}(self):\n{textwrap.indent(body, ' ' * 8)}\n\n\n"
                   "if __name__ == '__main__':\n    unittest.main()\n")
    task = TEMPLATE.format(test=test, module=module)
    tests = [{"path": f"{test}.py", "content": test_source}]
    return {"prompt": [{"role": "user", "content": task}], "task": task,
            "files": [{"path": f"{module}.py", "content": source}, *tests], "tests": tests, "test_module": test}


def solution(index: int) -> dict[str, str]:
    """Task ``index``'s module with its bug fixed, ``{path: text}`` (for tests and demonstrations)."""
    module, source, (bug, fix), _ = _repository(index)
    return {f"{module}.py": source.replace(bug, fix, 1)}


def coding_tasks(num_tasks: int = 12, start: int = 0) -> list[dict[str, Any]]:
    """Tasks ``start`` to ``start + num_tasks - 1`` (:func:`coding_task`)."""
    return [coding_task(i) for i in range(start, start + num_tasks)]


@dataclass
class CodingTasksArguments:
    """Options of the coding tasks (recipe flags)."""

    num_tasks: int = field(default=12, metadata={"help": "Training rows: tasks 0 .. num_tasks - 1."})
    eval_tasks: int = field(default=8, metadata={"help": "Held-out rows, after the training ones (0: none)."})
    test_timeout: float = field(default=60.0, metadata={"help": "Seconds for a row's tests in the agent's directory."})


class TestsPass(RewardFunction):
    """1.0 when the row's tests pass in the working directory the CLI left (``agent_output``, a
    :class:`~trl_agentic.cli_agents.CLIResult`), else 0.0 (``None`` output: the run failed). The row's ``tests`` are
    written again first, then ``python -S -m unittest <test_module>`` runs there, confined as the CLI was
    (``sandbox``), within ``timeout`` seconds.

    Args:
        sandbox: ``"auto"``, ``"bwrap"`` or ``"none"``, as :class:`~trl_agentic.cli_agents.CLIAgent`'s.
        timeout: Seconds for the tests (past it: 0.0).
        name: ``__name__`` (TRL's ``rewards/<name>`` metric).
    """

    __test__ = False  # not a pytest class

    def __init__(self, sandbox: str = "auto", timeout: float = 60.0, name: str = "tests_pass") -> None:
        super().__init__(name)
        self.sandbox, self.timeout = sandbox, timeout

    def score(self, sample: Sample) -> float:
        output = sample.columns.get("agent_output")
        if not isinstance(output, CLIResult) or not Path(output.workdir).is_dir():
            return 0.0
        write_files(Path(output.workdir), sample.column("tests"))
        try:
            done = run_command([PYTHON, "-S", "-m", "unittest", "-q", sample.column("test_module")],
                               output.workdir, sandbox=self.sandbox, timeout=self.timeout, name="the tests")
        except CLIRunError:
            return 0.0
        return float(done.exit_code == 0)
