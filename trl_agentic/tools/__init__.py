"""Tools for agents: a sandboxed Python interpreter, a safe calculator, and retrieval (Search-R1).

Every tool is a :class:`Tool`: ``tool.invoke(text) -> ToolOutput`` with the flags the rollout engine counts, and
``tool(text) -> observation text`` (never raising for bad input), ``await tool.acall(text)``. Stateful tools (the
interpreters) also have ``session() -> Tool``: one per trajectory, closed when it ends. See
:mod:`trl_agentic.tools.base` and ``docs/tools.md``.

Importing this package imports only the standard library; optional extras (``bm25s``, ``faiss``,
``e2b-code-interpreter``, ``transformers``) are imported by the classes that use them.
"""

from .base import (
    Tool,
    ToolCall,
    ToolOutput,
    call_tool,
    tool_error,
    truncate_middle,
)
from .calculator import Calculator, CalculatorError, safe_eval
from .code import (
    CodeSandbox,
    CodeSession,
    E2BSandbox,
    E2BSession,
    ExecutionResult,
    PythonSandbox,
    PythonSession,
    SandboxError,
    SandboxIsolation,
    detect_sandbox_backend,
    extract_code,
    run_unit_tests,
)
from .retrieval import (
    BM25Retriever,
    DenseRetriever,
    RetrievalClient,
    RetrievalServer,
    RetrievalServerError,
    SearchTool,
    TransformerEncoder,
    format_search_results,
    load_corpus,
    load_retriever,
    serve,
)

__all__ = [
    "Tool",
    "ToolOutput",
    "ToolCall",
    "call_tool",
    "tool_error",
    "truncate_middle",
    "Calculator",
    "CalculatorError",
    "safe_eval",
    "PythonSandbox",
    "PythonSession",
    "ExecutionResult",
    "SandboxError",
    "SandboxIsolation",
    "detect_sandbox_backend",
    "extract_code",
    "E2BSandbox",
    "E2BSession",
    "CodeSandbox",
    "CodeSession",
    "run_unit_tests",
    "BM25Retriever",
    "DenseRetriever",
    "TransformerEncoder",
    "RetrievalClient",
    "RetrievalServer",
    "RetrievalServerError",
    "SearchTool",
    "format_search_results",
    "load_corpus",
    "load_retriever",
    "serve",
]
