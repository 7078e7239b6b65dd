"""``--help`` of every command-line entry point: each ``python -m trl_agentic...`` module and each script that the
README, the docs, the notebooks, the recipes or the benchmarks name prints its usage and exits 0; a module's usage
line names the command a user types (``python -m ...``), and example commands keep their lines.

The list is read from those files, so a command added to the docs is tested without editing this file."""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from forkserver import run_python

ROOT = Path(__file__).resolve().parents[1]
_COMMAND = re.compile(r"python (-m trl_agentic[a-z_.]*|[a-z0-9_/]+\.py)\b")


def _named_commands() -> list[str]:
    files = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("recipes/*.py"),
             *ROOT.glob("benchmarks/**/*.py"), *ROOT.glob("trl_agentic/**/*.py")]
    found = {match.group(1) for path in files for match in _COMMAND.finditer(path.read_text(encoding="utf-8"))}
    return sorted(found)


COMMANDS = _named_commands()
_RECIPE_FLAGS = ("--config", "--max_turns", "--overlap_chunks", "--kl_estimator", "--learning_rate")
_RFT_FLAGS = ("--config", "--rounds", "--samples_per_row", "--learning_rate")  # SFT rounds: no RL flags


def test_the_list_is_complete():
    """Every recipe and every ``__main__`` of the package is among the commands the docs name."""
    recipes = {f"recipes/{p.name}" for p in ROOT.glob("recipes/*.py")}
    modules = {
        "-m " + ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in ROOT.glob("trl_agentic/**/*.py")
        if 'if __name__ == "__main__"' in p.read_text(encoding="utf-8")
    }
    assert recipes | modules <= set(COMMANDS), (recipes | modules) - set(COMMANDS)
    assert len(COMMANDS) >= 15


# python -m trl_agentic.evaluate --help shows its example as written, one line per flag group
_EVALUATE_EXAMPLE = ("\n    python -m trl_agentic.evaluate --model outputs/gsm8k-tools-grpo --task gsm8k_tools \\\n"
                     "        --dataset openai/gsm8k --dataset_config main --split test")


def _typed(command: str) -> list[str]:
    """What a user types for ``-m module``: ``python -m module``, or a console script of pyproject.toml that runs it
    (never the file's name, argparse's default: "usage: demo.py")."""
    module = command.split()[1]
    scripts = re.findall(rf'^(\S+) = "{re.escape(module)}:\w+"', (ROOT / "pyproject.toml").read_text(), re.M)
    return [f"python {command}", *scripts]


def test_help_of_every_command(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "PYTHONIOENCODING": "utf-8"}
    # forked from a server with torch and TRL imported (tests/forkserver.py): most of a command's time was importing them
    with ThreadPoolExecutor(4) as pool:
        done = dict(zip(COMMANDS, pool.map(lambda command: run_python([*command.split(), "--help"], env=env, cwd=ROOT,
                                                                         timeout=300), COMMANDS)))
    failures = []
    for command, process in done.items():
        out, err = process.stdout, process.stderr
        if process.returncode != 0 or "usage:" not in out:
            failures.append(f"python {command} --help: exit {process.returncode}: {err.strip()[-300:]}")
            continue
        if command.startswith("-m ") and not any(out.startswith(f"usage: {name} ") for name in _typed(command)):
            failures.append(f"python {command} --help: usage line {out.splitlines()[0]!r} is not the command")
        if command == "-m trl_agentic.evaluate" and _EVALUATE_EXAMPLE not in out:
            failures.append(f"python {command} --help reflows its example command into one line")
        elif command.startswith("recipes/"):  # docs/recipes.md: --help lists every flag, ours and TRL's
            flags = _RFT_FLAGS if command == "recipes/rft.py" else _RECIPE_FLAGS
            failures += [f"python {command} --help lacks {flag}" for flag in flags if flag not in out]
    assert not failures, "\n".join(failures)
