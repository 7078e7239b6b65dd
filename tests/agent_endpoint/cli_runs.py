"""Run the real Codex CLI and Claude Code against the endpoint, for the tests that check the endpoint serves each
CLI's requests as it sends them (``test_codex_cli.py``, ``test_claude_code.py``).

The agents here are the least a test needs (the CLI as a child process in a scratch working directory, its standard
input closed, the trajectory's base URL, key and proof headers in the CLI's own configuration); the runner users
train with is :mod:`trl_agentic.cli_agents`. The CLIs are found on ``PATH`` (CI: ``npm install --prefix
"$HOME/cli-agents" @openai/codex@0.169.0 @anthropic-ai/claude-code@2.1.197`` and that ``node_modules/.bin`` on
``PATH``); a test whose CLI is missing is skipped (:data:`needs_codex`, :data:`needs_claude`), naming the command that
installs it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

CODEX = shutil.which("codex")
CLAUDE = shutil.which("claude")
needs_codex = pytest.mark.skipif(CODEX is None, reason="codex is not installed: npm install @openai/codex@0.169.0 "
                                 "(its node_modules/.bin on PATH)")
needs_claude = pytest.mark.skipif(CLAUDE is None, reason="claude is not installed: npm install "
                                  "@anthropic-ai/claude-code@2.1.197 (its node_modules/.bin on PATH)")
CLI_TIMEOUT_S = 120.0


def scratch_workdir(prefix: str) -> Path:
    """An empty working directory in a fresh scratch directory (the CLI's home goes beside it)."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix)) / "work"
    workdir.mkdir()
    return workdir


def made(path: Path) -> str | None:
    """The text of a file the CLI was to write, ``None`` if it did not."""
    return path.read_text() if path.exists() else None


def codex_config(endpoint: Any, extra: str = "", web_search: str = "disabled") -> str:
    """Codex CLI's ``config.toml``: the trajectory's endpoint as a Responses provider, its proof headers sent with
    each request, web search (a tool the server would run) off unless ``web_search`` says otherwise."""
    headers = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in endpoint.headers.items())
    return (f'model = "policy"\nmodel_provider = "trl"\nweb_search = {json.dumps(web_search)}\n{extra}\n'
            f'[model_providers.trl]\nname = "trl"\nbase_url = {json.dumps(endpoint.base_url)}\n'
            f'env_key = "TRL_AGENTIC_KEY"\nwire_api = "responses"\nhttp_headers = {{ {headers} }}\n')


async def run_cli(argv: list[str], workdir: Path, env: dict[str, str]) -> tuple[int, str]:
    """Run ``argv`` in ``workdir`` with standard input closed (Codex waits on it otherwise) and ``env`` over a bare
    environment; its exit status and output (stdout then stderr). The process is killed past the timeout."""
    process = await asyncio.create_subprocess_exec(
        *argv, cwd=workdir, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env},
        start_new_session=True)
    try:
        out, err = await asyncio.wait_for(process.communicate(), CLI_TIMEOUT_S)
    except asyncio.TimeoutError:
        process.kill()
        await process.wait()
        raise
    return process.returncode, out.decode(errors="replace") + err.decode(errors="replace")


async def run_codex(endpoint: Any, workdir: Path, task: str, extra_config: str = "",
                    web_search: str = "disabled") -> tuple[int, str]:
    """``codex exec`` on ``task`` against the trajectory's endpoint (commands run unsandboxed, in ``workdir``)."""
    home = workdir.parent / "home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(codex_config(endpoint, extra_config, web_search))
    argv = [CODEX, "exec", "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox", task]
    return await run_cli(argv, workdir, {"HOME": str(home), "CODEX_HOME": str(home),
                                         "TRL_AGENTIC_KEY": endpoint.api_key})


async def run_claude(endpoint: Any, workdir: Path, task: str, nonessential: bool = False) -> tuple[int, str]:
    """``claude -p`` on ``task`` against the trajectory's endpoint, its Bash tool allowed; ``nonessential`` lets it
    make its auxiliary calls (the session title)."""
    home = workdir.parent / "home"
    home.mkdir(exist_ok=True)
    env = {"HOME": str(home), "ANTHROPIC_BASE_URL": endpoint.base_url.removesuffix("/v1"),
           "ANTHROPIC_API_KEY": endpoint.api_key, "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
           "DISABLE_ERROR_REPORTING": "1",
           "ANTHROPIC_CUSTOM_HEADERS": "\n".join(f"{k}: {v}" for k, v in endpoint.headers.items())}
    if not nonessential:
        env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] = "1"
    argv = [CLAUDE, "-p", task, "--output-format", "json", "--allowedTools", "Bash"]
    return await run_cli(argv, workdir, env)
