"""The coding tasks for CLI agents (``trl_agentic.tasks.coding``): generated the same every time, each test file
fails on its repository and passes once the bug is fixed, and the reward runs the row's own tests, confined as the
CLI was, so a run that edits the tests does not pass them."""

from __future__ import annotations

from pathlib import Path

import pytest

from trl_agentic.cli_agents import CLIResult
from trl_agentic.cli_agents.sandbox import bwrap_works
from trl_agentic.cli_agents.workspace import write_files
from trl_agentic.tasks.coding import FAMILIES, TestsPass, coding_task, coding_tasks, solution

N = 2 * len(FAMILIES)
SANDBOX = "bwrap" if bwrap_works() is None else "none"


def left(tmp_path: Path, row: dict, *edits: dict) -> CLIResult:
    """A CLI run's result whose working directory holds ``row``'s files with ``edits`` written over them (removed
    with the result)."""
    workdir = tmp_path / row["test_module"]
    workdir.mkdir(parents=True)
    for files in (row["files"], *edits):
        write_files(workdir, files)
    return CLIResult(str(workdir), 0, "", "", 0.0)


def rewards(rows, outputs) -> list[float]:
    columns = {key: [row[key] for row in rows] for key in ("tests", "test_module")}
    return TestsPass(sandbox=SANDBOX)([r["prompt"] for r in rows], [[] for _ in rows], agent_output=outputs, **columns)


def test_the_tasks_are_the_same_on_every_call_and_each_has_its_own_module():
    assert coding_tasks(N) == coding_tasks(N) and coding_tasks(4, start=9) == coding_tasks(N)[9:13]
    assert coding_task(3) == coding_tasks(N)[3]
    assert len({row["test_module"] for row in coding_tasks(N)}) == N
    row = coding_task(0)
    assert row["task"] == ("The tests in test_arith.py fail. Fix arith.py so that `python -m unittest test_arith` "
                           "passes; do not change the tests.")
    assert row["prompt"] == [{"role": "user", "content": row["task"]}]


def test_each_repository_fails_its_tests_and_passes_them_once_fixed(tmp_path):
    rows = coding_tasks(N)
    as_given = [left(tmp_path / "given", row) for row in rows]
    fixed = [left(tmp_path / "fixed", row, solution(i)) for i, row in enumerate(rows)]
    assert rewards(rows, as_given) == [0.0] * N
    assert rewards(rows, fixed) == [1.0] * N


def test_editing_the_tests_does_not_pass_them_and_a_failed_run_scores_zero(tmp_path):
    row = coding_task(0)
    cheat = {"test_arith.py": "import unittest\n\nclass Test(unittest.TestCase):\n    def test(self):\n        pass\n"}
    cheated = left(tmp_path, row, cheat)
    assert rewards([row, row], [cheated, None]) == [0.0, 0.0]
    assert (Path(cheated.workdir) / "test_arith.py").read_text() == row["tests"][0]["content"]


@pytest.mark.skipif(bwrap_works() is not None, reason=str(bwrap_works()))
def test_the_tests_run_confined_as_the_cli_was(tmp_path):
    """Under bubblewrap a test file sees only its directory (the host's files are absent)."""
    row = dict(coding_task(0))
    secret = tmp_path / "secret.txt"
    secret.write_text("x")
    probe = (f"import os, unittest\n\nclass Test(unittest.TestCase):\n    def test(self):\n"
             f"        self.assertTrue(os.path.exists({str(secret)!r}))\n")
    row["tests"] = [{"path": "test_arith.py", "content": probe}]
    fixed = left(tmp_path, row)
    assert TestsPass(sandbox="none")([None], [[]], agent_output=[fixed], tests=[row["tests"]],
                                     test_module=["test_arith"]) == [1.0]
    assert TestsPass(sandbox="bwrap")([None], [[]], agent_output=[fixed], tests=[row["tests"]],
                                      test_module=["test_arith"]) == [0.0]
