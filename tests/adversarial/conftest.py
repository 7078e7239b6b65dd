"""Hostile-input tests: every test in this folder is marked ``adversarial`` (``python -m pytest -m adversarial``).

A test whose failure mode is a hang runs its body in a child process with ``helpers.run_isolated``, so that a hang
fails the test after a timeout instead of hanging CI.
"""

from pathlib import Path

import pytest


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.adversarial)
