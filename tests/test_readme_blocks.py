"""Every ```python block of README.md runs as written, offline, in the order of the README (one session, as a reader
follows it), in a fresh working directory. Blocks of docs/*.md that are complete programs are run too."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(path: Path) -> list[str]:
    return _BLOCK.findall(path.read_text(encoding="utf-8"))


def test_readme_blocks_run_as_written(tmp_path, monkeypatch):
    blocks = python_blocks(ROOT / "README.md")
    assert len(blocks) >= 3
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    namespace: dict = {"__name__": "__readme__"}
    for i, code in enumerate(blocks):
        exec(compile(code, f"README.md python block {i + 1}", "exec"), namespace)  # noqa: S102 - our own README
    assert namespace["trainer"].state.global_step == 2
    assert os.path.isdir(tmp_path / "tiny-qwen2")
