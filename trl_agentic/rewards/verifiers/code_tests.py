"""Code outcome reward: the fraction of a task's unit tests that the model's program passes, run in
:class:`~trl_agentic.tools.PythonSandbox` workers (never in the training process) and out of the program's reach.

Program extraction (:func:`extract_program`), from the model's own text (observations never count), trying
``sources`` in order: ``"answer"``, the last ``<answer>`` block; ``"fence"``, the last fenced code block
(```` ```python ... ``` ````); ``"code"``, the last ``<code>`` block. Fences inside the chosen block are removed.

Scoring (:func:`~trl_agentic.tools.run_unit_tests`): the program runs once in a fresh
interpreter; each test runs as its own block in a *second* interpreter that calls the program's functions through
the parent and gets only data back, so one failing assertion does not hide the others and the program can neither
patch the harness nor forge a verdict nor return an object that equals everything. With ``n`` tests of which
``p`` pass (a test passes when its block raises nothing and does not time out), the reward is ``p / n``, or
``1[p = n]`` with ``all_or_nothing``. A program that is missing or fails on its own scores 0; a row without tests
gives ``None``. Tests are a list of code strings (MBPP's ``test_list``: ``["assert f(1) == 2", ...]``) or one
string (a whole test program, e.g. HumanEval's ``check`` function followed by ``check(entry_point)``). What a
test can and cannot do with the program's objects is listed in ``docs/tools.md``.
"""

from __future__ import annotations

import queue
import re
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...tools import PythonSandbox, extract_code, run_unit_tests
from ..base import OBSERVATION_TAGS, RewardFunction, Sample, make_samples
from ..text import last_block

PROGRAM_SOURCES: tuple[str, ...] = ("answer", "fence", "code")
_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)


def _last_fence(text: str) -> str | None:
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else None


def extract_program(text: str, sources: Sequence[str] = PROGRAM_SOURCES) -> str | None:
    """The model's program in ``text`` (rule in the module docstring); ``None`` when no source finds one."""
    finders = {
        "answer": lambda t: last_block(t, "answer"),
        "fence": _last_fence,
        "code": lambda t: last_block(t, "code"),
    }
    unknown = set(sources) - set(finders)
    if unknown:
        raise ValueError(f"unknown program sources {sorted(unknown)}; choose from {list(finders)}")
    for source in sources:
        block = finders[source](text)
        program = extract_code(block) if block else ""
        if program.strip():
            return program
    return None


class CodeTestsReward(RewardFunction):
    """Unit-test pass rate of the model's program (see the module docstring).

    Args:
        tests_column: Dataset column(s) with the tests, first present used.
        sources: Program extraction order, see :func:`extract_program`.
        all_or_nothing: Reward 1 only when every test passes.
        sandbox: A :class:`~trl_agentic.tools.PythonSandbox` to use (each completion takes a worker for its
            program; up to ``max_workers`` tests workers are kept and reused across completions);
            by default one is created on first use with ``sandbox_kwargs`` and closed by :meth:`close`. A remote
            sandbox (E2B) cannot keep the tests apart from the program, so it is refused.
        sandbox_kwargs: Arguments of the sandbox created by default (e.g. ``{"timeout": 5}``).
        max_workers: Completions tested concurrently (one interpreter each).
        name: ``__name__`` (metric name in TRL).
    """

    def __init__(
        self,
        tests_column: str | Sequence[str] = ("tests", "test_list", "test"),
        sources: Sequence[str] = PROGRAM_SOURCES,
        all_or_nothing: bool = False,
        sandbox: Any = None,
        sandbox_kwargs: Mapping[str, Any] | None = None,
        max_workers: int = 4,
        name: str = "code_pass_rate",
    ) -> None:
        super().__init__(name)
        if sandbox is not None and not isinstance(sandbox, PythonSandbox):
            raise TypeError(
                f"CodeTestsReward needs a PythonSandbox (the tests run in a second local interpreter, apart from the "
                f"program), not {type(sandbox).__name__}; pass sandbox=PythonSandbox(...) or sandbox_kwargs"
            )
        self.tests_column = tests_column
        self.sources = tuple(sources)
        extract_program("", self.sources)  # validate the sources early
        self.all_or_nothing = all_or_nothing
        self.sandbox_kwargs = dict(sandbox_kwargs or {})
        self.max_workers = max_workers
        self._sandbox = sandbox
        self._owns_sandbox = sandbox is None
        self._lock = threading.Lock()
        self._tests_sessions: queue.SimpleQueue = queue.SimpleQueue()

    def _get_sandbox(self) -> Any:
        with self._lock:
            if self._sandbox is None:
                self._sandbox = PythonSandbox(**self.sandbox_kwargs)
            return self._sandbox

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        samples = make_samples(prompts, completions, kwargs)
        with ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="code-tests") as pool:
            return list(pool.map(self.score, samples))

    def score(self, sample: Sample) -> float | None:
        tests = sample.column(self.tests_column)
        tests = [tests] if isinstance(tests, str) else list(tests or [])
        tests = [test for test in tests if test and test.strip()]
        if not tests:
            return None
        program = extract_program(sample.model_text(OBSERVATION_TAGS), self.sources)
        if program is None:
            return 0.0
        sandbox = self._get_sandbox()
        try:  # a tests worker runs no program code, so one serves many completions
            tests_session = self._tests_sessions.get_nowait()
        except queue.Empty:
            tests_session = sandbox.session()
        try:
            rate = sum(run_unit_tests(sandbox, program, tests, tests_session)) / len(tests)
        finally:
            self._tests_sessions.put(tests_session)
        return float(rate == 1.0) if self.all_or_nothing else rate

    def close(self) -> None:
        """Close the tests sessions, and the sandbox this reward created (a sandbox passed in is left to its
        owner)."""
        while not self._tests_sessions.empty():
            self._tests_sessions.get_nowait().close()
        with self._lock:
            if self._owns_sandbox and self._sandbox is not None:
                self._sandbox.close()
                self._sandbox = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_lock"] = None
        state["_tests_sessions"] = None
        if self._owns_sandbox:
            state["_sandbox"] = None  # worker processes do not pickle; a copy starts its own sandbox
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._tests_sessions = queue.SimpleQueue()
