"""An OpenEnv MCP tool environment trains with its own tools (trl_agentic.integrations.openenv_mcp), through the real
package: tests/integrations/envs/adder_env is an MCPEnvironment whose FastMCP tools (add, submit) are defined as
OpenEnv's echo_env defines its own, served by its app under uvicorn on 127.0.0.1 (OpenEnvServers) and driven through
its own MCPToolClient subclass. Nothing of the environment is written again: the model is shown the tools its server
lists, each call goes to the trajectory's session, and the result comes back as the call's tool message.

The "model" is scripted on what it reads: it adds the two numbers of the question with the add tool, then submits
the number the tool's message says (one more when it is odd, so that half the answers are wrong): a result that did
not come back as a tool message leaves it nothing to submit.

openenv 0.10 pins mcp<2: these tests run in .venv-openenv (.ci/run) and are skipped elsewhere."""

from __future__ import annotations

import json
import random
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("openenv.core.env_server", reason="openenv runs in its own venv (.venv-openenv, .ci/run)")

from helpers import ScriptedGenerator  # noqa: E402
from helpers import native_call as call  # noqa: E402
from integration_helpers import assert_token_exact, logged, record, trainer_of  # noqa: E402

ENV_DIR = Path(__file__).resolve().parent / "envs" / "adder_env"
APP = "adder_env.server.app:app"
HEADER, END = "<|im_start|>assistant\n", "<|im_end|>"
QUESTION = re.compile(r"What is (\d+) plus (\d+)\?")
TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)


@pytest.fixture(scope="module", autouse=True)
def adder_env_installed():
    """The environment package importable, as `pip install -e tests/integrations/envs/adder_env` makes it."""
    sys.path.insert(0, str(ENV_DIR))
    yield
    sys.path.remove(str(ENV_DIR))


def numbers(seed: int) -> tuple[int, int]:
    """The two numbers the environment's reset draws from ``seed``."""
    rng = random.Random(seed)
    return rng.randint(1, 50), rng.randint(1, 50)


def adder(tokenizer, first_turn=None):
    """A generator that plays the adder: add the question's numbers, then submit the number the tool answered (the
    second rollout that reached the same conversation submits one more: a wrong answer). ``first_turn(text)`` may
    write a trajectory's first turn instead (``None``: the add)."""
    seen: Counter[str] = Counter()

    def script(ids: list[int]) -> str:
        text = tokenizer.decode(ids)
        turns = text.split(HEADER)[1:]  # the turns so far, then the one to write
        a, b = map(int, QUESTION.search(text).groups())
        responses = TOOL_RESPONSE.findall(text)
        if len(turns) == 1:
            turn = first_turn(text) if first_turn is not None else None
            return (turn or call("add", a=a, b=b)) + END
        if responses and responses[-1].isdigit():
            seen[text] += 1
            return call("submit", answer=int(responses[-1]) + (seen[text] == 2)) + END
        return call("add", a=a, b=b) + END  # after an error: add, as planned

    return ScriptedGenerator(tokenizer, script)


def submitted(run) -> int:
    """The answer a trajectory submitted (its last turn's call)."""
    return json.loads(run.actions[-1].split("<tool_call>")[1].split("</tool_call>")[0])["arguments"]["answer"]


def dataset(seeds, prompt: str = "Use the tools to answer."):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [[{"role": "user", "content": prompt}]] * len(seeds), "seed": list(seeds)})


def question(observation) -> str:
    return "\n" + observation.metadata["question"]


def trainer(kind, qwen, tmp_path, environment, seeds, generator=None, **config):
    from trl_agentic.rewards import TurnReward

    tok = qwen.load_tokenizer()
    run = trainer_of(kind, tmp_path, model=qwen.load_model(), processing_class=tok, train_dataset=dataset(seeds),
                     reward_funcs=TurnReward("sum", name="openenv_reward"), environment=environment,
                     config={"rollout_mode": "chat", "max_tokens_per_turn": 96, "max_completion_length": 512,
                             **config})
    run.rollout_seam.engine.generator = generator or adder(tok)
    return run


def listed_tools(url: str) -> list[dict]:
    """The tools the server lists, through the environment's own client, as a chat template's tools."""
    from adder_env import AdderEnv

    with AdderEnv(base_url=url).sync() as client:
        return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                  "parameters": t.input_schema}} for t in client.list_tools()]


def mask_audits(run) -> list[float]:
    return [entry["agentic/mask_audit"] for entry in run.state.log_history if "agentic/mask_audit" in entry]


@pytest.mark.parametrize("kind", ["grpo", "ppo"])
def test_an_mcp_tool_environment_trains_with_its_own_tools(qwen, tmp_path, kind):
    """Both trainers, two steps: the prompt shows the schemas the server lists (and the question its reset drew),
    the add call reaches the server and its result comes back as a tool message (the submitted number is read from
    it), the submission's reward is the environment's own, the episode ends when the environment says done; the
    trained ids are the sampled ids, and the mask audit is 0 in every step."""
    from adder_env import AdderEnv

    from trl_agentic.integrations.openenv import OpenEnvServers, openenv_mcp_environment

    with OpenEnvServers(APP, num_servers=2, environments=4) as servers:
        environment = openenv_mcp_environment(servers, client=AdderEnv, reset_text=question)
        run = trainer(kind, qwen, tmp_path, environment, seeds=range(8))
        recording, rounds = record(run)
        run.train()
        schemas = listed_tools(servers.url())
    assert run.state.global_step == 2
    assert [schema["function"]["name"] for schema in schemas] == ["add", "submit"]
    runs = [r for round_ in rounds for r in round_.runs]
    rows = [row for round_ in rounds for row in round_.rows]
    assert len(runs) == 4
    for r, row in zip(runs, rows):
        a, b = numbers(row["seed"])
        prompt = qwen.tokenizer.decode(r.prompt_ids)
        assert all(json.dumps(schema, ensure_ascii=False) in prompt for schema in schemas), prompt
        assert prompt.count('{"type": "function"') == 2  # no tool of our own beside the listed ones
        assert f"Use the tools to answer.\nWhat is {a} plus {b}?" in prompt
        assert r.stop_reason == "terminated" and not r.error, r.error
        assert [info["tool"] for info in r.turn_infos] == [["add"], ["submit"]]
        assert r.observations[0] == str(a + b)  # the add tool's result, as the call's tool message
        assert {"role": "tool", "name": "add", "content": str(a + b)} in r.messages
        right = float(submitted(r) == a + b)
        assert r.turn_rewards == [0.0, right]  # the environment's own reward, on the turn that submitted
        assert json.loads(r.turn_infos[1]["state_key"])["done"] is True
    trained = [float(x) for round_ in rounds for x in round_.run_rewards[:, 0]]
    assert trained == [float(submitted(r) == sum(numbers(row["seed"]))) for r, row in zip(runs, rows)]
    assert trained == ([1.0, 0.0] * 2 if kind == "grpo" else [1.0] * 4)  # a GRPO group's second rollout: wrong
    assert_token_exact(runs, recording)
    assert mask_audits(run) == [0.0, 0.0]
    assert {"rewards/openenv_reward/mean", "agentic/tool_calls/add_per_trajectory"} <= logged(run)
    assert servers.restarts == 0


HOSTILE_APP = '''import asyncio
import os
import signal

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

from adder_env.server.adder_environment import AdderEnvironment


class HostileAdderEnvironment(AdderEnvironment):
    """The adder with three more tools: one that raises, one that never answers, one that kills its server."""

    def __init__(self):
        super().__init__()

        @self.mcp_server.tool
        def unlock() -> str:
            """Unlock the adder."""
            raise ValueError("the adder is locked for good")

        @self.mcp_server.tool
        async def wait() -> str:
            """Wait for the adder."""
            await asyncio.sleep(3600)
            return "ready"

        @self.mcp_server.tool
        def crash() -> str:
            """Crash the adder."""
            os.kill(os.getpid(), signal.SIGKILL)
            return "crashed"


app = create_app(HostileAdderEnvironment, CallToolAction, CallToolObservation, env_name="adder_env",
                 max_concurrent_envs=64)
'''


@pytest.fixture
def hostile_app(tmp_path):
    """The hostile adder's app, and the servers' PYTHONPATH (the adder's package and the app's folder)."""
    import os

    (tmp_path / "hostile_adder_app.py").write_text(HOSTILE_APP)
    sys.path.insert(0, str(tmp_path))
    yield "hostile_adder_app:app", {"PYTHONPATH": os.pathsep.join([str(ENV_DIR), str(tmp_path)])}
    sys.path.remove(str(tmp_path))


def test_a_tool_that_raises_costs_its_call_and_one_that_hangs_its_trajectory(qwen, tmp_path, hostile_app):
    """Four kinds of rows, two rollouts each, in one round: a first call to a tool that raises is answered with the
    environment's error as TRL answers a tool that raised, and the trajectory goes on to add and submit; a call with
    an argument of the wrong JSON type (check_argument_types, against the listed schema) is answered with the error
    before it reaches the server; a call that the server never answers ends its trajectory after tool_timeout,
    named in one line; the plain rows play as ever. Nothing else fails, and the mask audit is 0."""
    from datasets import Dataset

    from trl_agentic.integrations.openenv import OpenEnvServers, openenv_mcp_environment

    app, env = hostile_app
    prompts = {"plain": "Use the tools to answer.", "unlock": "Unlock the adder first.",
               "wait": "Wait for the adder first.", "words": "Add the numbers in words."}
    firsts = {"unlock": call("unlock"), "wait": call("wait"), "words": call("add", a="one", b=2)}

    def first_turn(text: str) -> str | None:
        return next((turn for kind, turn in firsts.items() if prompts[kind] in text), None)

    rows = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in prompts.values()],
                              "seed": [3, 4, 5, 6]})
    tok = qwen.load_tokenizer()
    with OpenEnvServers(app, num_servers=1, env=env, environments=8) as servers:
        environment = openenv_mcp_environment(servers, reset_text=question, tool_timeout=2.0,
                                              check_argument_types=True)
        run = trainer_of("grpo", tmp_path, model=qwen.load_model(), processing_class=tok, train_dataset=rows,
                         reward_funcs=lambda **kwargs: [0.0] * len(kwargs["prompts"]), environment=environment,
                         config={"rollout_mode": "chat", "max_tokens_per_turn": 96, "max_completion_length": 768,
                                 "per_device_train_batch_size": 8, "max_steps": 1})
        run.rollout_seam.engine.generator = adder(tok, first_turn)
        _, rounds = record(run)
        run.train()
        url = servers.servers[0].base_url
    kinds = [next(kind for kind, prompt in prompts.items() if prompt in r.prompt[0]["content"]) for r in rounds[0].runs]
    assert sorted(kinds) == sorted(list(prompts) * 2)
    for r, row, kind in zip(rounds[0].runs, rounds[0].rows, kinds):
        if kind == "wait":
            assert r.stop_reason == "env_error" and r.error == (
                f"OpenEnvMCPEnvironment.step raised MCPSessionError: the MCP tool wait on the OpenEnv server at {url} "
                "did not answer within 2 s"), r.error
            continue
        assert r.stop_reason == "terminated" and not r.error, r.error
        if kind == "plain":
            assert [info["tool"] for info in r.turn_infos] == [["add"], ["submit"]]
            continue
        assert [info["tool"] for info in r.turn_infos] == [[kind if kind == "unlock" else "add"], ["add"], ["submit"]]
        assert r.turn_infos[0]["tool_error"] == 1
        error = {"unlock": "{'error': \"Error calling tool 'unlock': the adder is locked for good\"}",
                 "words": "{'error': \"argument 'a' of add must be integer, got 'one'\"}"}[kind]
        assert r.observations[0] == error, r.observations[0]
        assert r.turn_rewards == [0.0, 0.0, float(submitted(r) == sum(numbers(row["seed"])))]
    assert mask_audits(run) == [0.0]


def test_a_server_that_dies_costs_the_trajectories_on_it(qwen, tmp_path, hostile_app):
    """Two servers, two trajectories on each: the first trajectory of the run calls the tool that kills its server
    (SIGKILL, as the OOM killer would). Its trajectory and the other one on that server end with env_error, each
    named in one line with the server; the two on the other server play on. The next round's sessions find the
    server gone: it is restarted, the healthy one is handed out, and every trajectory plays."""
    from trl_agentic.integrations.openenv import OpenEnvServers, openenv_mcp_environment

    app, env = hostile_app
    crashed: list[str] = []

    def first_turn(text: str) -> str | None:
        if crashed:
            return None
        crashed.append(text)
        return call("crash")

    tok = qwen.load_tokenizer()
    with OpenEnvServers(app, num_servers=2, env=env, environments=4, health_timeout=1.0) as servers:
        environment = openenv_mcp_environment(servers, reset_text=question)
        urls = [server.base_url for server in servers.servers]
        run = trainer("grpo", qwen, tmp_path, environment, seeds=range(8), generator=adder(tok, first_turn),
                      per_device_train_batch_size=4)
        _, rounds = record(run)
        run.train()
        restarts = servers.restarts
    assert run.state.global_step == 2 and restarts == 1
    first, second = rounds[0].runs, rounds[1].runs
    failed = [r for r in first if r.stop_reason == "env_error"]
    assert len(failed) == 2 and all(r.stop_reason == "terminated" for r in first if r not in failed), \
        [r.stop_reason for r in first]
    dead = next(url for url in urls if url in failed[0].error)
    for r in failed:
        assert re.fullmatch(rf"OpenEnvMCPEnvironment\.step raised MCPSessionError: the MCP tool call (crash|add|submit) "
                            rf"on the OpenEnv server at {re.escape(dead)} failed: [^\n]+", r.error), r.error
    assert any("the MCP tool call crash" in r.error for r in failed)
    assert all(r.stop_reason == "terminated" for r in second), [(r.stop_reason, r.error) for r in second]
    assert mask_audits(run) == [0.0, 0.0]


def test_an_app_that_serves_no_mcp_tools_is_refused_before_training():
    """The guess environment (an OpenEnv environment of typed actions, no MCP tools) lists no tools: refused when
    the environment is built, in one line that says what the app must serve."""
    import os

    from trl_agentic.integrations.openenv import OpenEnvServers, openenv_mcp_environment

    guess = str(ENV_DIR.parent / "guess_env")
    with OpenEnvServers("guess_env.server.app:app", env={"PYTHONPATH": os.pathsep.join([guess, str(ENV_DIR)])}) \
            as servers:
        with pytest.raises(ValueError, match=r"^OpenEnvMCPEnvironment\.reset raised MCPSessionError: the OpenEnv "
                                             r"server at http://127\.0\.0\.1:\d+ lists no MCP tools: its app must "
                                             r"serve an MCPEnvironment \(create_app\(\.\.\., CallToolAction, "
                                             r"CallToolObservation\)\); nothing trains on it$"):
            openenv_mcp_environment(servers)


def test_a_results_text_is_its_content_as_mcp_clients_show_it():
    """MCP's CallToolResult (as the session's observation carries it): its text parts one after another, a part
    that is not text as its JSON; a result marked isError is the call's error; an environment's own value (a
    result that is not MCP's) as its text."""
    from trl_agentic.integrations.openenv_mcp import MCPToolError, result_text

    image = {"type": "image", "data": "AAAA", "mimeType": "image/png"}
    result = {"content": [{"type": "text", "text": "5"}, image, {"type": "text", "text": "done"}],
              "structured_content": {"result": 5}, "is_error": False}
    assert result_text(result) == "5\n" + json.dumps(image, sort_keys=True) + "\ndone"
    with pytest.raises(MCPToolError, match=r"^no such table$"):
        result_text({"content": [{"type": "text", "text": "no such table"}], "isError": True})
    assert result_text("Hello!") == "Hello!" and result_text({"message": "Hi", "length": 2}) == \
        '{"message": "Hi", "length": 2}' and result_text(None) == "None"
