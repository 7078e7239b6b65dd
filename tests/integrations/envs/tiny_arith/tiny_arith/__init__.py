"""tiny-arith: a verifiers v1 environment package, written as verifiers' docs show (a taskset and a harness exported
through ``__all__``), that runs offline: its harness is an in-process tool loop, so no program is installed."""

from tiny_arith.harness import ToolLoopHarness, ToolLoopHarnessConfig
from tiny_arith.taskset import TinyArithTaskset

__all__ = ["TinyArithTaskset", "ToolLoopHarness", "ToolLoopHarnessConfig"]
