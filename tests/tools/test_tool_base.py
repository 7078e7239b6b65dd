from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import trl_agentic.tools
from trl_agentic.tools import (
    Calculator,
    Tool,
    ToolOutput,
    call_tool,
    tool_error,
    truncate_middle,
)


def test_truncate_middle_keeps_head_and_tail():
    text = "A" * 50 + "B" * 50
    short, cut = truncate_middle(text, 20)
    assert cut and short.startswith("A" * 10) and short.endswith("B" * 10)
    assert "[80 characters truncated]" in short
    assert truncate_middle("abc", 10) == ("abc", False)
    assert truncate_middle("abc", None) == ("abc", False)
    assert truncate_middle("abc", 10, omitted_extra=5) == ("abc", True)


def test_call_tool_calls_every_kind_of_tool_and_never_raises():
    """The one way a tool is called: a Tool's ToolOutput, a plain or async callable's value, an exception or a
    timeout as an error (never raised); the one error format is TRL's."""
    import time

    def boom(text):
        raise RuntimeError("kaput")

    async def async_tool(text):
        return text[::-1]

    def slow(text):
        time.sleep(5)

    run = asyncio.run
    failed = run(call_tool(boom, ("x",), timeout=5))
    assert (failed.error, failed.exception, failed.timed_out, failed.value) == ("kaput", "RuntimeError", False, None)
    assert run(call_tool(str.upper, ("abc",), timeout=5)).value == "ABC"
    assert run(call_tool(Calculator(), ("1+1",), timeout=5)).value == ToolOutput("2")
    assert run(call_tool(async_tool, ("abc",), timeout=5)).value == "cba"
    assert run(call_tool(lambda a, b: a * b, kwargs={"a": 6, "b": 7}, timeout=5)).value == 42
    started = time.perf_counter()
    late = run(call_tool(slow, ("x",), timeout=0.2))
    assert late.timed_out and late.error == "timed out after 0.2 s" and time.perf_counter() - started < 2
    assert tool_error("kaput") == "{'error': 'kaput'}" and tool_error("\ud800") == "{'error': '\\ud800'}"


def test_as_info_has_the_keys_the_engine_counts():
    info = ToolOutput("x", error=True, timeout=True, observation_truncated=True, info={"exit_status": 1}).as_info()
    assert info == {"exit_status": 1, "tool_error": True, "tool_timeout": True, "observation_truncated": True}


def test_one_tool_abstraction_and_sessions():
    from trl_agentic.tools import PythonSandbox, SearchTool

    for name in ("BaseTool", "ToolSession", "StatefulTool"):
        assert not hasattr(trl_agentic.tools, name), name
    calc = Calculator()
    assert isinstance(calc, Tool) and not hasattr(calc, "session") and issubclass(SearchTool, Tool)
    sb = PythonSandbox(pool_size=0)
    try:
        assert isinstance(sb, Tool)
        session = sb.session()
        assert isinstance(session, Tool)  # a session is a tool too, with close()
        assert session("1 + 1") == "2\n" and session.invoke("x = 3\nx").observation == "3\n"
        session.close()
        assert session.closed
    finally:
        sb.close()


def test_a_tool_subclass_gets_call_and_async_from_invoke():
    class Shout(Tool):
        name = "shout"

        def invoke(self, text):
            return ToolOutput(text.upper(), error=not text)

    shout = Shout()
    assert shout("hey") == "HEY" and asyncio.run(shout.acall("ho")) == "HO"
    assert asyncio.run(shout.ainvoke("")).error


def test_importing_tools_stays_light():
    code = (
        "import sys\n"
        "import trl_agentic.tools, trl_agentic.tools.retrieval, trl_agentic.tools.code.e2b\n"
        "from trl_agentic.tools import PythonSandbox, Calculator, SearchTool, BM25Retriever, DenseRetriever\n"
        "heavy = [m for m in ('torch', 'trl', 'transformers', 'bm25s', 'faiss', 'numpy', 'e2b', "
        "'e2b_code_interpreter', 'tokenizers') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(root))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
