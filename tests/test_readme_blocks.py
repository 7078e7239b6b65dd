"""Every ```python block of README.md runs as written, offline, in the order of the README (one session, as a reader
follows it), in a fresh working directory. So does every ```python block of each docs/*.md file, one session per
file; a file whose blocks read what a documented shell command writes gets that command run first, as written
(``SHELL_FIRST``). No block is skipped: a block that is not a program is not fenced as ```python."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_BASH = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
_YAML = re.compile(r"^```yaml\n(.*?)^```", re.S | re.M)
# docs whose blocks need packages that live in venvs of their own: their test runs each section in its venv
OWN_VENVS = {"environments.md": "tests/integrations/test_environments_doc.py"}
DOCS = sorted(p for p in (ROOT / "docs").glob("*.md")
              if _BLOCK.search(p.read_text(encoding="utf-8")) and p.name not in OWN_VENVS)
# docs whose python blocks read the output of one of their shell blocks: the block that contains this text runs first
SHELL_FIRST = {"recipes.md": "--trajectory_dir outputs/gsm8k-tools-grpo/trajectories"}


def _agents_doc_trained(namespace: dict) -> None:
    """docs/agents.md: two steps, and every evaluated run reached the model (on a template without tool calls the
    endpoint refused every request with 400, and the block still ran to its end)."""
    assert namespace["trainer"].state.global_step == 2
    runs = namespace["trajectories"]
    assert len(runs) == 8 and all(t.segments and not t.events.get("bad_request") for t in runs)


# what a doc's blocks must have done, beyond running without an error
DOC_CHECKS = {"agents.md": _agents_doc_trained}


def python_blocks(path: Path) -> list[str]:
    return _BLOCK.findall(path.read_text(encoding="utf-8"))


# the programs a shell block may run: ``python`` is this interpreter, ``trl-agentic`` the console script (pyproject.toml)
PROGRAMS = {"python": [sys.executable], "trl-agentic": [sys.executable, "-m", "trl_agentic.cli"]}


def run_shell_block(block: str, cwd: Path) -> None:
    """Each command of a ```bash block, continuation lines joined, as written (``PROGRAMS``)."""
    for line in block.replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if not argv:
            continue
        assert argv[0] in PROGRAMS, f"only {' and '.join(PROGRAMS)} commands are run here: {line}"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
        proc = subprocess.run([*PROGRAMS[argv[0]], *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, f"{line}\n{proc.stderr[-3000:]}"


def test_readme_blocks_run_as_written(tmp_path, monkeypatch):
    """The README's workflow, as a reader runs it: a TRL environment class through SFT, GRPO, evaluate and render."""
    blocks = python_blocks(ROOT / "README.md")
    assert len(blocks) >= 1
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    namespace: dict = {"__name__": "__readme__"}
    for i, code in enumerate(blocks):
        exec(compile(code, f"README.md python block {i + 1}", "exec"), namespace)  # noqa: S102 - our own README
    assert namespace["trainer"].state.global_step == 2
    assert namespace["report"].num_rows == 3 and namespace["report"].samples_per_row == 4
    page = (tmp_path / "trajectories.html").read_text(encoding="utf-8")
    assert page.count('<section class="traj"') == 12 and os.path.isdir(tmp_path / "tiny-qwen2")


def test_guide_trl_agentic_command_runs_as_written(tmp_path):
    """The guide's ``trl-agentic grpo ... --tools`` lines, offline: TRL's tools= on the tiny model (Qwen2.5's
    template renders the tool, TRL's response template parses its calls), two steps, the model saved."""
    text = (ROOT / "docs" / "guide.md").read_text(encoding="utf-8")
    (block,) = [b for b in _BASH.findall(text) if "trl-agentic grpo" in b]
    assert "--tools" in block
    run_shell_block(block, tmp_path)
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_recipes_doc_trl_agentic_config_runs_as_written(tmp_path):
    """docs/recipes.md's my_run.yaml (TRL's tools= from the YAML), saved as the reader would, and its two lines."""
    text = (ROOT / "docs" / "recipes.md").read_text(encoding="utf-8")
    (config,) = [b for b in _YAML.findall(text) if b.startswith("# my_run.yaml")]
    (tmp_path / "my_run.yaml").write_text(config, encoding="utf-8")
    (block,) = [b for b in _BASH.findall(text) if "save_addition_dataset" in b]
    assert "trl-agentic grpo --config my_run.yaml" in block
    run_shell_block(block, tmp_path)
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_the_readme_gives_two_commands_the_demo_and_the_tests():
    """The README's two commands: the offline demo and the test command CI runs (``.ci/run``)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    (block,) = [b for b in _BASH.findall(text) if "trl_agentic.demo" in b]
    commands = [line.split("#")[0].strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    assert commands == ["python -m trl_agentic.demo", "python -m pytest -n 2 --dist loadgroup"], commands
    assert f"\n{commands[1]}\n" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")  # CI runs the README's command


def test_the_development_page_names_a_short_first_test_command():
    """The whole suite takes most of half an hour: docs/development.md gives a short command to run first, whose
    tests exist, and says how long each command takes."""
    quick_start = _BASH.findall((ROOT / "docs" / "development.md").read_text(encoding="utf-8"))[0]
    commands = [line for line in quick_start.replace("\\\n", " ").splitlines() if line.startswith("python -m pytest")]
    first = [shlex.split(line, comments=True)[3:] for line in commands if "tests/" in line]
    assert len(commands) == 2 and len(first) == 1 and all(" min" in line or " s" in line for line in commands)
    for node in first[0]:
        path, _, test = node.partition("::")
        assert (ROOT / path).is_file(), node
        assert not test or f"def {test}(" in (ROOT / path).read_text(encoding="utf-8"), node


def test_the_docs_with_python_blocks():
    """The docs the issue named are among those whose blocks run (a block fenced otherwise would escape)."""
    assert {"agents.md", "guide.md", "recipes.md", "rewards.md", "sft.md", "tools.md"} <= {p.name for p in DOCS}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_docs_blocks_run_as_written(doc, tmp_path, monkeypatch):
    """The python blocks of one doc, in order, in one namespace, in a fresh directory, offline. The directory has
    the checkout's ``recipes/`` and ``tests/`` (linked), where the docs' commands are run from."""
    for name in ("recipes", "tests"):
        (tmp_path / name).symlink_to(ROOT / name)
    if doc.name in SHELL_FIRST:
        (block,) = [b for b in _BASH.findall(doc.read_text(encoding="utf-8")) if SHELL_FIRST[doc.name] in b]
        run_shell_block(block, tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    namespace: dict = {"__name__": f"__{doc.stem}__"}
    for i, code in enumerate(python_blocks(doc)):
        exec(compile(code, f"docs/{doc.name} python block {i + 1}", "exec"), namespace)  # noqa: S102 - our docs
    if doc.name in DOC_CHECKS:
        DOC_CHECKS[doc.name](namespace)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation but hyphens dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readmes_links_reach_a_file_and_a_heading():
    """The front page links into docs/ for everything it leaves out: each link names a file of the checkout and,
    with an anchor, one of its headings."""
    links = re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)(?:#([\w-]+))?\)", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(links) >= 10
    for path, anchor in links:
        target = ROOT / path
        assert target.is_file(), path
        if anchor:
            headings = re.findall(r"^#+ (.*)$", target.read_text(encoding="utf-8"), re.M)
            assert anchor in {_anchor(h) for h in headings}, f"{path}#{anchor}"
