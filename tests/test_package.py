"""The package surface: every exported name resolves, and importing the package loads no optional extra."""

import subprocess
import sys

import trl_agentic


def test_every_export_resolves():
    for name in trl_agentic.__all__:
        assert getattr(trl_agentic, name) is not None, name


def test_import_loads_no_optional_extra():
    code = (
        "import sys, trl_agentic, trl_agentic.tools, trl_agentic.rewards, trl_agentic.tasks,"
        " trl_agentic.tools.retrieval.server;"
        "bad = [m for m in ('vllm', 'bitsandbytes', 'e2b_code_interpreter', 'bm25s', 'faiss', 'math_verify', 'trl',"
        " 'fastapi', 'uvicorn', 'starlette')"
        " if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
