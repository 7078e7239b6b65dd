"""The Colab notebooks: executed top to bottom with papermill in smoke mode (a failing cell fails the test), and the
parts that matter on Colab checked statically (the install cell, the parameters cell, the device placement)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def _code(path: Path) -> list[str]:
    import nbformat

    return [cell.source for cell in nbformat.read(str(path), as_version=4).cells if cell.cell_type == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_in_smoke_mode(path, tmp_path, monkeypatch):
    papermill = pytest.importorskip("papermill")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend shows the plot
    out, checkout = tmp_path / path.name, tmp_path / "checkout"  # the kernel runs where papermill is run
    checkout.mkdir()
    papermill.execute_notebook(str(path), str(out), parameters={"SMOKE": True}, cwd=str(checkout),
                               kernel_name="python3", progress_bar=False, execution_timeout=300)
    assert not list(checkout.iterdir()), "a smoke run leaves nothing where it runs (the checkout)"
    import nbformat

    cells = [c for c in nbformat.read(str(out), as_version=4).cells if c.cell_type == "code"]
    assert all(c.execution_count for c in cells), "every code cell ran"
    outputs = [o for c in cells for o in c.outputs]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "before: accuracy" in text and "after:  accuracy" in text
    displays = [o.data for o in outputs if o.output_type == "display_data"]
    assert any("image/png" in d for d in displays), "the reward curve is plotted"
    assert sum("trl-agentic trajectories" in d.get("text/html", "") or "Trajectory 0" in d.get("text/html", "")
               for d in displays) >= 2, "the HTML trajectory views are shown inline"
    adapter = Path(text.split("saved to ", 1)[1].split()[0])  # a temporary folder in smoke mode
    assert (adapter / "adapter_config.json").exists()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_install_and_parameters(path):
    import nbformat

    notebook = nbformat.read(str(path), as_version=4)
    nbformat.validate(notebook)
    parameters = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(parameters) == 1 and "SMOKE = False" in parameters[0].source
    assert "TRL_AGENTIC_SOURCE = None" in parameters[0].source  # the one variable to change (on Colab)
    code = "\n".join(_code(path))
    assert "<ORG>" not in code and '.to("cuda")' not in code and "vllm]" not in code
    install = next(c for c in _code(path) if "pip" in c and "install" in c)
    assert '"[math,retrieval]"' in install and "vllm" not in install.split("extras =")[1].split("\n")[0]
    assert 'DEVICE = "cuda" if torch.cuda.is_available() else "cpu"' in code and "model.to(DEVICE)" in code
    assert "from trl_agentic.evaluate import evaluate" in code and "render_html" in code


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_install_cell_installs_the_checkout_or_says_what_to_set(path, monkeypatch):
    """trl-agentic is not on PyPI: run from a clone, the install cell pip-installs that checkout; elsewhere it stops
    with one line saying what to set (it never asks pip for a package no index has)."""
    import importlib.util
    import subprocess
    import sys

    install = next(c for c in _code(path) if "pip" in c and "install" in c and "find_spec" in c)
    calls = []
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trl_agentic" else real_find_spec(name, *a))
    monkeypatch.setattr(subprocess, "check_call", lambda args: calls.append(args))
    monkeypatch.chdir(REPO / "notebooks")
    exec(compile(install, "install cell", "exec"), {"TRL_AGENTIC_SOURCE": None, "__name__": "__nb__"})  # noqa: S102
    assert calls == [[sys.executable, "-m", "pip", "install", "-q", f"{REPO}[math,retrieval]"]]
    calls.clear()
    exec(compile(install, "install cell", "exec"), {"TRL_AGENTIC_SOURCE": "git+https://example.org/trl-agentic.git"})  # noqa: S102
    assert calls[0][-1] == "trl-agentic[math,retrieval] @ git+https://example.org/trl-agentic.git"
    monkeypatch.chdir("/")
    with pytest.raises(RuntimeError, match="not on PyPI.*set TRL_AGENTIC_SOURCE"):
        exec(compile(install, "install cell", "exec"), {"TRL_AGENTIC_SOURCE": None})  # noqa: S102
