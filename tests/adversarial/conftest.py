"""Hostile-input tests: every test in this folder is marked ``adversarial`` (``python -m pytest -m adversarial``).

A test whose failure mode is a hang runs its body in a child process with :func:`run_isolated`, so that a hang fails
the test after a timeout instead of hanging CI.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.adversarial)


def run_isolated(code: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Run ``code`` (dedented) in a fresh Python with the repository and ``tests/`` importable; a run that outlasts
    ``timeout`` seconds fails the calling test with the output so far."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")])
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        pytest.fail(f"hung: no result after {timeout} s\nstdout:\n{out[-2000:]}\nstderr:\n{err[-2000:]}")
