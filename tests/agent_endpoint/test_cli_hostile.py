"""Command-line agents that misbehave (written first): a CLI that crashes, hangs, floods its output, is refused, or
leaves a background process costs its own trajectory only, and leaves nothing running; under bubblewrap it reaches
the endpoint and nothing else. The CLI here is ``fake_cli.py`` (a small script) against the real endpoint, its
model scripted (:class:`~helpers.ScriptedGenerator`)."""

from __future__ import annotations

import json
import os
import socket
import sys
import uuid
from pathlib import Path

import pytest
from helpers import ScriptedGenerator

from trl_agentic.agents import AgentRollout
from trl_agentic.cli_agents import CLIAgent, CLIResult
from trl_agentic.cli_agents.sandbox import bwrap_works
from trl_agentic.rollout.config import RolloutConfig

pytestmark = pytest.mark.adversarial

FAKE = Path(__file__).resolve().parent / "fake_cli.py"
PYTHON = os.path.realpath(sys.executable)
SANDBOXES = [pytest.param("bwrap", marks=pytest.mark.skipif(bwrap_works() is not None, reason=str(bwrap_works()))),
             "none"]


RUN_ID = uuid.uuid4().hex
"""On the command line of every process this test session's fake CLIs start (other sessions may run beside it)."""


def fake_cli(sandbox: str, timeout: float = 30.0, extra_env: dict | None = None, **options) -> CLIAgent:
    """``fake_cli.py <task> <RUN_ID>`` as a :class:`CLIAgent`."""
    return CLIAgent(lambda run: [PYTHON, "-I", "-S", str(FAKE), run.task, RUN_ID],
                    lambda run: {"OPENAI_BASE_URL": run.base_url, "OPENAI_API_KEY": run.api_key,
                                 "PROOF_HEADERS": json.dumps(dict(run.headers)), **(extra_env or {})},
                    installation=[str(FAKE.parent)], name="fake-cli", timeout=timeout, sandbox=sandbox, **options)


def rollout(qwen, agent, **config):
    """The endpoint for ``agent``, and a generator whose first turn calls ``bash`` to write ``done.txt`` and whose
    second says it is done."""
    tok = qwen.load_tokenizer()

    def script(ids):
        if "<tool_response>" in tok.decode(ids):
            return "finished<|im_end|>"
        return '<tool_call>\n{"name": "bash", "arguments": {"command": "echo done > done.txt"}}\n</tool_call><|im_end|>'

    values = {"max_turns": 4, "max_tokens_per_turn": 64, "max_completion_length": 512, "env_timeout": 60.0, **config}
    ro = AgentRollout(agent, tok, RolloutConfig(**values), [tok.convert_tokens_to_ids("<|im_end|>")])
    return ro, ScriptedGenerator(tok, script)


def left_running() -> list[str]:
    """The command lines of this session's fake CLI processes still alive, and of their launchers (whose command
    line holds the CLI's)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if RUN_ID in cmdline and int(pid) != os.getpid():
            found.append(cmdline)
    return found


def did_the_task(trajectory) -> bool:
    output = trajectory.agent_output
    return isinstance(output, CLIResult) and (Path(output.workdir) / "done.txt").read_text() == "done\n"


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_each_misbehaving_cli_costs_its_own_trajectory_and_leaves_nothing_running(qwen, sandbox):
    ro, gen = rollout(qwen, fake_cli(sandbox, timeout=8.0, max_output_bytes=1 << 20))
    kinds = ["agent", "crash", "hang", "flood", "refused", "background", "fails-after", "agent"]
    out = ro.run([{"task": kind} for kind in kinds], gen)
    ro.close()
    by_kind = dict(zip(kinds, out))
    assert [t.stop_reason for t in out] == ["terminated", "env_error", "env_error", "env_error", "env_error",
                                            "terminated", "terminated", "terminated"]
    assert by_kind["crash"].error == ("agent raised CLIAgentError: fake-cli exited with status 3 without a model "
                                      "reply; its last output: (none)")
    assert by_kind["hang"].error.startswith("agent raised CLIRunError: fake-cli ran past its wall-clock bound of 8 s")
    assert "fake-cli wrote over max_output_bytes=1048576 bytes of output and was stopped" in by_kind["flood"].error
    refused = by_kind["refused"].error
    assert refused.startswith("agent raised CLIAgentError: fake-cli exited with status 1 without a model reply")
    assert refused.endswith("; the endpoint refused its request: the last message may not be an assistant message "
                            "(continuing one is not supported)")
    assert "\n" not in refused
    for t in (out[0], by_kind["background"], by_kind["fails-after"], out[-1]):
        assert did_the_task(t) and t.agent_output.stdout == "finished\n"
        assert t.requests == 2 and len(t.segments) == 1
    assert [t.agent_output.exit_code for t in (out[0], by_kind["fails-after"])] == [0, 2]  # scored as any run
    assert left_running() == []
    workdirs = [t.agent_output.workdir for t in out if t.agent_output is not None]
    assert len(workdirs) == 4 and all(os.path.isdir(w) for w in workdirs)
    del out, by_kind, t
    assert not any(os.path.exists(w) for w in workdirs)  # each goes with its result


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_cli_cancelled_at_env_timeout_leaves_nothing_running(qwen, sandbox):
    ro, gen = rollout(qwen, fake_cli(sandbox, timeout=600.0), env_timeout=2.0)
    out = ro.run([{"task": "hang"}, {"task": "agent"}], gen)
    ro.close()
    assert [t.stop_reason for t in out] == ["env_timeout", "terminated"]
    assert did_the_task(out[1])
    assert left_running() == []


def test_under_bubblewrap_the_cli_reaches_the_endpoint_and_nothing_else(qwen, tmp_path):
    if bwrap_works() is not None:
        pytest.skip(bwrap_works())
    secret = tmp_path / "secret.txt"
    secret.write_text("the host's file")
    listener = socket.create_server(("127.0.0.1", 0))
    probe = {"PROBE_FILE": str(secret), "PROBE_PORT": str(listener.getsockname()[1])}
    outputs = {}
    for sandbox in ("bwrap", "none"):
        ro, gen = rollout(qwen, fake_cli(sandbox, extra_env=probe))
        [t] = ro.run([{"task": "probe", "files": {"src/app.py": "print('hi')\n"}}], gen)
        ro.close()
        assert did_the_task(t) and (Path(t.agent_output.workdir) / "src" / "app.py").read_text() == "print('hi')\n"
        outputs[sandbox] = t.agent_output.stdout.splitlines()[:2]
    listener.close()
    assert outputs["bwrap"] == ["cannot read: FileNotFoundError", "cannot connect: ConnectionRefusedError"]
    assert outputs["none"] == ["read: the host's file", "connected"]  # what sandbox="none" does not confine


def test_a_row_whose_files_leave_the_working_directory_costs_its_trajectory(qwen):
    ro, gen = rollout(qwen, fake_cli("none"))
    out = ro.run([{"task": "agent", "files": {"../escape.txt": "x"}}, {"task": "agent", "files": {"ok.txt": "x"}}],
                 gen)
    ro.close()
    assert [t.stop_reason for t in out] == ["env_error", "terminated"]
    assert out[0].error == ("agent raised ValueError: a file's path must be relative and stay inside the working "
                            "directory, got '../escape.txt'")
