"""Train the command-line agents people already run (Codex CLI, Claude Code, mini-swe-agent, or any other), each
in its own process, unchanged: ``agent=CLIAgent(...)`` for both trainers and ``evaluate``.

Each trajectory runs the CLI as a child process (:class:`CLIAgent`), with:

- a fresh working directory built from its row (``files``; the ``task`` column is the text the CLI is given) and a
  scratch home (:mod:`~trl_agentic.cli_agents.workspace`);
- the trajectory's own base URL and key in the conventions the CLI reads (:mod:`~trl_agentic.cli_agents.presets`);
- under bubblewrap when it works here: files confined to the working directory and the CLI's installation, a
  network namespace whose loopback carries the endpoint alone (:mod:`~trl_agentic.cli_agents.sandbox`,
  :mod:`~trl_agentic.cli_agents.relay`);
- a wall-clock bound, an output bound, and every process it started ended when it finishes, is stopped or is
  cancelled (:mod:`~trl_agentic.cli_agents.process`, :mod:`~trl_agentic.cli_agents.launcher`).

Reward functions receive a :class:`CLIResult` as ``agent_output``: the working directory as the CLI left it, its exit
status and its output (``trl_agentic.tasks.coding.tests_pass`` runs the row's tests there). A run that is stopped
(past ``timeout``, over ``max_output_bytes``) or that exits non-zero without a single model reply fails its own
trajectory (``env_error``, one line), never the batch.
"""

from .agent import CLIAgent, CLIAgentError, CLIResult, CLIRun
from .presets import CLINotInstalled, claude_code, codex, mini_swe_agent
from .process import CLIRunError
from .sandbox import SandboxUnavailable

__all__ = ["CLIAgent", "CLIAgentError", "CLINotInstalled", "CLIResult", "CLIRun", "CLIRunError",
           "SandboxUnavailable", "claude_code", "codex", "mini_swe_agent"]
