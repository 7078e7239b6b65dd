"""The command-line agents people already run, as :class:`~trl_agentic.cli_agents.agent.CLIAgent` s: each told the
trajectory's base URL and key the way it reads them, kept from calling anywhere else, run non-interactively.

- :func:`mini_swe_agent`: mini-swe-agent (``pip install mini-swe-agent``), chat completions through litellm
  (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``), one ``bash`` tool.
- :func:`codex`: Codex CLI (``npm install @openai/codex``), ``codex exec``, the Responses API through a provider in
  ``$CODEX_HOME/config.toml`` (``base_url``, ``env_key``, ``wire_api = "responses"``).
- :func:`claude_code`: Claude Code (``npm install @anthropic-ai/claude-code``), ``claude -p``, Anthropic's Messages
  API (``ANTHROPIC_BASE_URL``, ``ANTHROPIC_API_KEY``), its non-essential traffic, telemetry and updater off.

Each takes the options of :class:`CLIAgent` (``timeout``, ``sandbox``, ...) as keyword arguments.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

from ..tools.code.host import python_dirs
from .agent import CLIAgent, CLIRun

MINI_VERSION = "2.4.6"
CODEX_VERSION = "0.169.0"
CLAUDE_CODE_VERSION = "2.1.197"
CLAUDE_TOOLS = ("Bash", "Edit", "Write", "Read", "Glob", "Grep")
"""The Claude Code tools allowed without asking (a ``-p`` run cannot ask)."""
SHORT_PROMPT = "You are a coding agent. Run shell commands with your tool to do the task, then say that you are done."
"""The instructions ``short_prompt=True`` gives Codex CLI and Claude Code in place of their own."""
CODEX_SHORT_CONFIG = ("include_permissions_instructions = false\ninclude_environment_context = false\n"
                      "[features]\nmulti_agent = false\ngoals = false\nrequest_user_input = false\n")
"""What ``short_prompt=True`` leaves out of Codex CLI's requests: its permissions and environment messages, its
multi-agent, goal and user-input tools."""


class CLINotInstalled(FileNotFoundError):
    """The CLI a preset runs is not installed where it looks."""


def mini_script() -> str | None:
    """mini-swe-agent's ``mini`` script: on ``PATH``, else beside this interpreter (the package installed in this
    Python's environment, which need not be activated), else ``None``."""
    return shutil.which("mini") or shutil.which("mini", path=os.path.dirname(sys.executable))


def mini_swe_agent(executable: str | None = None, step_limit: int = 10, config: str = "mini.yaml",
                   **options: Any) -> CLIAgent:
    """mini-swe-agent's ``mini`` in yolo mode (``-y --exit-immediately``): its ``mini.yaml`` prompts and one
    ``bash`` tool, at most ``step_limit`` model calls, no cost limit, one try per request (its default retries a
    refused request ten times, minutes apart).

    Args:
        executable: The ``mini`` script (default: ``mini`` on ``PATH``); its interpreter's installation is bound
            into the sandbox.
        step_limit: mini-swe-agent's ``agent.step_limit``.
        config: Its config file (a name of its built-in ones or a path).
    """
    mini = _found(executable or mini_script(), "mini-swe-agent", f"pip install mini-swe-agent=={MINI_VERSION}")
    interpreter = _shebang(mini)

    def command(run: CLIRun) -> list[str]:
        return [mini, "-y", "--exit-immediately", "-m", f"openai/{run.model}", "-t", run.task, "-c", config,
                "-c", f"{run.home}/trl-agentic.yaml", "-l", "0", "-o", f"{run.home}/trajectory.json"]

    def env(run: CLIRun) -> dict[str, str]:
        return {"OPENAI_BASE_URL": run.base_url, "OPENAI_API_KEY": run.api_key, "MSWEA_CONFIGURED": "true",
                "MSWEA_SILENT_STARTUP": "1", "MSWEA_COST_TRACKING": "ignore_errors",
                "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1", "MSWEA_GLOBAL_CONFIG_DIR": f"{run.home}/.mini-swe-agent",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONDONTWRITEBYTECODE": "1"}

    def home_files(run: CLIRun) -> dict[str, str]:  # JSON is YAML
        return {"trl-agentic.yaml": json.dumps({"agent": {"step_limit": step_limit},
                                                "model": {"model_kwargs": {"extra_headers": dict(run.headers)}}})}

    installation = [os.path.dirname(mini), *(python_dirs(interpreter) if interpreter else ())]
    return CLIAgent(command, env, home_files, installation=[*installation, *options.pop("installation", ())],
                    name="mini-swe-agent", **options)


def codex(executable: str | None = None, instructions: str | None = None, config: str = "",
          short_prompt: bool = False, **options: Any) -> CLIAgent:
    """Codex CLI, ``codex exec --skip-git-repo-check`` with its own sandbox off (``--dangerously-bypass-approvals-and-
    sandbox``: the run is in ours), its provider the trajectory's endpoint over the Responses API (its proof headers
    in the provider's ``http_headers``), web search off (a tool the endpoint would have to run).

    Args:
        executable: ``codex`` (default: on ``PATH``); the ``node_modules`` it was installed in is bound into the
            sandbox.
        instructions: Instructions in place of Codex's own (its ``model_instructions_file``), e.g. a short one for a
            model whose context cannot hold Codex's (``docs/agents.md``).
        config: More ``config.toml``, placed after the keys set here and before the provider's table (its own tables
            last), e.g. ``"[features]\\nmulti_agent = false"``.
        short_prompt: :data:`SHORT_PROMPT` as ``instructions`` (unless given) and :data:`CODEX_SHORT_CONFIG` before
            ``config``: its first request goes from about 26,000 tokens to 4,800 (``docs/agents.md``).
    """
    if short_prompt:
        instructions, config = instructions or SHORT_PROMPT, CODEX_SHORT_CONFIG + config
    codex_bin = _found(executable or shutil.which("codex"), "Codex CLI",
                       f"npm install --prefix DIR @openai/codex@{CODEX_VERSION} (DIR/node_modules/.bin on PATH)")

    def command(run: CLIRun) -> list[str]:
        return [codex_bin, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                "--color", "never", run.task]

    def env(run: CLIRun) -> dict[str, str]:
        return {"CODEX_HOME": f"{run.home}/.codex", "TRL_AGENTIC_KEY": run.api_key}

    def home_files(run: CLIRun) -> dict[str, str]:
        headers = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in run.headers.items())
        own = f"model_instructions_file = {json.dumps(run.home + '/.codex/instructions.md')}\n" if instructions else ""
        files = {".codex/config.toml": (
            f'model = {json.dumps(run.model)}\nmodel_provider = "trl_agentic"\nweb_search = "disabled"\n'
            f'check_for_update_on_startup = false\n{own}{config}\n\n[model_providers.trl_agentic]\n'
            f'name = "trl-agentic"\nbase_url = {json.dumps(run.base_url)}\nenv_key = "TRL_AGENTIC_KEY"\n'
            f'wire_api = "responses"\nhttp_headers = {{ {headers} }}\n')}
        if instructions:
            files[".codex/instructions.md"] = instructions
        return files

    return CLIAgent(command, env, home_files, installation=[_node_modules(codex_bin), *options.pop("installation", ())],
                    name="Codex CLI", **options)


def claude_code(executable: str | None = None, system_prompt: str | None = None, tools: Sequence[str] | None = None,
                short_prompt: bool = False, **options: Any) -> CLIAgent:
    """Claude Code, ``claude -p TASK --output-format json`` with its file and shell tools allowed without asking
    (``--allowedTools``: the run is in our sandbox), talking to the trajectory's endpoint over Anthropic's Messages
    API (its proof headers in ``ANTHROPIC_CUSTOM_HEADERS``), its non-essential traffic, telemetry, error reports and
    updater off.

    Args:
        executable: ``claude`` (default: on ``PATH``); the ``node_modules`` it was installed in is bound into the
            sandbox.
        system_prompt: A system prompt in place of Claude Code's own (``--system-prompt``), e.g. a short one for a
            model whose context cannot hold Claude Code's (``docs/agents.md``).
        tools: The built-in tools it offers (``--tools``), e.g. ``["Bash"]``; default: all of them.
        short_prompt: :data:`SHORT_PROMPT` as ``system_prompt`` and ``Bash`` alone as ``tools`` (unless given): its
            first request goes from about 57,000 tokens to 2,700 (``docs/agents.md``).
    """
    if short_prompt:
        system_prompt, tools = system_prompt or SHORT_PROMPT, tools or ["Bash"]
    claude_bin = _found(executable or shutil.which("claude"), "Claude Code",
                        f"npm install --prefix DIR @anthropic-ai/claude-code@{CLAUDE_CODE_VERSION} (DIR/node_modules"
                        "/.bin on PATH)")
    chosen = [*(["--system-prompt", system_prompt] if system_prompt else []), *(["--tools", *tools] if tools else [])]

    def command(run: CLIRun) -> list[str]:
        return [claude_bin, "-p", run.task, "--output-format", "json", *chosen, "--allowedTools", *CLAUDE_TOOLS]

    def env(run: CLIRun) -> dict[str, str]:
        return {"ANTHROPIC_BASE_URL": run.root_url, "ANTHROPIC_API_KEY": run.api_key, "ANTHROPIC_MODEL": run.model,
                "ANTHROPIC_CUSTOM_HEADERS": "\n".join(f"{k}: {v}" for k, v in run.headers.items()),
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
                "DISABLE_ERROR_REPORTING": "1"}

    return CLIAgent(command, env, installation=[_node_modules(claude_bin), *options.pop("installation", ())],
                    name="Claude Code", **options)


def _found(path: str | None, name: str, install: str) -> str:
    """``path`` when it is an executable file, else :class:`CLINotInstalled` saying how to install ``name``."""
    if path is None or not os.access(path, os.X_OK):
        where = f" at {path}" if path else " (not on PATH)"
        raise CLINotInstalled(f"{name} is not installed{where}: {install}")
    return os.path.abspath(path)


def _node_modules(executable: str) -> str:
    """The ``node_modules`` directory an npm package's executable was installed in (its package and the platform
    binaries beside it), else the executable's directory."""
    real = Path(os.path.realpath(executable))
    return str(next((p for p in real.parents if p.name == "node_modules"), real.parent))


def _shebang(script: str) -> str | None:
    """The interpreter a script's ``#!`` line names (a console script's Python), or ``None``."""
    with open(script, "rb") as fh:
        first = fh.readline(512)
    if not first.startswith(b"#!"):
        return None
    interpreter = first[2:].decode(errors="replace").split()[0]
    return interpreter if Path(interpreter).exists() else None
