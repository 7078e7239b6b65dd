"""Unit tests of an untrusted program, each run where the program cannot reach it (:func:`run_unit_tests`).

Running the tests in the program's own interpreter lets the program decide its score: it can replace the
functions that run the tests or report their outcome, forge replies on the protocol pipe, patch ``builtins`` or
the modules the asserts use, or return an object equal to everything. So two sandbox workers are used:

- the *program* worker runs the program, then only answers questions about its globals (call this function with
  these arguments, read this attribute...), with data (``inside/calls.py``);
- the *tests* worker runs each test with stand-ins for the program's names; every call of a program function
  goes through the parent to the program worker, and only data comes back.

The verdict is the tests worker's reply to the test block (no error: passed). No program code runs in the tests
worker, so the verdict and the pipe that carries it are out of the program's reach; the program's only influence
is the values its functions return. Limits that remain are listed in ``docs/tools.md``.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from .sandbox import PythonSandbox
from .session import PythonSession


class _ProgramWorker:
    """The program's session: runs the program (again after its worker died) and answers the tests' questions."""

    def __init__(self, sandbox: PythonSandbox, program: str):
        self.sandbox = sandbox
        self.program = program
        self.session = sandbox.session()
        self.ready = False

    def start(self) -> bool:
        """Run the program in a fresh interpreter if needed; whether it ran without error."""
        if self.ready and self.session._worker is not None and self.session._worker.alive():
            return True
        self.session.restart()
        self.ready = self.session.request({"code": self.program})[0].ok
        return self.ready

    def answer(self, question: Any, deadline: float) -> dict[str, Any]:
        """The program worker's answer to ``question`` from the tests worker, within the test's ``deadline``."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return {"failed": "no time left in this test"}
        result, reply = self.session.request({"call": question}, timeout=remaining)
        if reply is None:
            self.ready = False
            return {"failed": result.error or "no reply"}
        return {key: reply[key] for key in ("value", "names", "raised", "args", "kwargs") if key in reply}

    def close(self) -> None:
        self.session.close()


def run_unit_tests(
    sandbox: PythonSandbox, program: str, tests: Sequence[str], tests_session: PythonSession | None = None
) -> list[bool]:
    """Whether each test passes against ``program``: the program runs once in one worker; each test runs as its
    own block (within ``sandbox.timeout``) in another worker, calling the program's functions through the parent
    (see the module docstring). A program that fails on its own fails every test; when the program's worker dies
    during a test (timeout, crash, ``os._exit``), the program is run again in a fresh one for the next test.

    ``tests_session``: a session of ``sandbox`` to run the tests in, kept open afterwards, so that one tests worker
    serves many programs (no program code ever runs in it; each test gets fresh globals). By default a session is
    opened and closed here."""
    program_worker = _ProgramWorker(sandbox, program)
    session = tests_session if tests_session is not None else sandbox.session()
    try:
        if not program_worker.start():
            return [False] * len(tests)
        passed = []
        for test in tests:
            if not program_worker.start():
                passed.append(False)
                continue
            result, reply = session.request({"code": test, "test": True}, on_rpc=program_worker.answer)
            passed.append(reply is not None and result.ok)
        return passed
    finally:
        program_worker.close()
        if tests_session is None:
            session.close()
