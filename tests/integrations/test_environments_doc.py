"""docs/environments.md runs as written: each section (verifiers, OpenEnv, OpenEnv's MCP tool environments,
TextArena) in the venv that has its package (the others are skipped there), in a fresh directory beside the
checkout's tests/, as a reader would: its bash lines run (``pip install -e ...``: the environment packages of
tests/integrations/envs), then its python blocks, in order, as one script in a fresh interpreter. A block whose
first line is ``# <path>`` is that file of tests/integrations/envs, and must be it, byte for byte."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "environments.md"
ENVS = Path(__file__).resolve().parent / "envs"
PACKAGES = {"verifiers": "verifiers.v1", "OpenEnv": "openenv.core.env_server",
            "OpenEnv MCP tool environments": "openenv.core.env_server", "TextArena": "textarena",
            "Several seats: self-play, a fixed opponent, a simulated user": "trl_agentic"}
_BLOCK = re.compile(r"^```(python|bash)\n(.*?)^```", re.S | re.M)


def sections() -> dict[str, str]:
    parts = re.split(r"^## ", DOC.read_text(encoding="utf-8"), flags=re.M)
    return {part.split("\n", 1)[0].strip(): part for part in parts[1:]}


def test_the_doc_has_a_section_for_each_ecosystem():
    assert set(PACKAGES) <= set(sections())


@pytest.mark.parametrize("title", list(PACKAGES))
def test_a_section_runs_as_written(title, tmp_path):
    pytest.importorskip(PACKAGES[title], reason=f"{title} runs in its own venv (.ci/run)")
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    script, files = [], 0
    for kind, code in _BLOCK.findall(sections()[title]):
        first = code.split("\n", 1)[0]
        if kind == "python" and first.startswith("# ") and first.endswith(".py"):
            shown = code.split("\n", 1)[1]
            assert shown == (ENVS / first[2:]).read_text(encoding="utf-8"), f"{first[2:]} differs from the doc"
            files += 1
        elif kind == "bash":
            for line in code.replace("\\\n", " ").splitlines():
                argv = shlex.split(line, comments=True)
                if not argv:
                    continue
                assert argv[:3] == ["pip", "install", "-e"], line
                proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *argv[2:]], cwd=tmp_path,
                                      env=env, capture_output=True, text=True, timeout=600)
                assert proc.returncode == 0, proc.stderr[-3000:]
        else:
            script.append(code)
    assert script, f"no python block in the {title} section"
    (tmp_path / "section.py").write_text("\n".join(script), encoding="utf-8")
    proc = subprocess.run([sys.executable, "section.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "tiny-qwen2" / "config.json").is_file()
    if title == "verifiers":
        assert files == 1 and "accuracy" in proc.stdout, proc.stdout
    if title in ("OpenEnv", "OpenEnv MCP tool environments"):
        assert files == 2
