"""Fixtures for the tools tests: one warm sandbox per available backend, shared by the module's tests."""

from __future__ import annotations

import pytest
from helpers import sandbox_backends

from trl_agentic.tools import PythonSandbox

BACKENDS = sandbox_backends()


@pytest.fixture(scope="module", params=BACKENDS)
def sandbox(request):
    """A sandbox with small limits; tests that need other limits build their own."""
    sb = PythonSandbox(
        backend=request.param, timeout=10.0, memory_mb=512, max_processes=16, max_output_chars=2000, pool_size=1
    )
    yield sb
    sb.close()
