"""An ``async def`` agent that blocks the agents' event loop (hostile tests, written first): the watchdog beside the
loop names the agent and the line that blocks, the block costs that agent's trajectory, and the agents it stalled
are not blamed. Each scenario runs in a child process: a hang fails the test instead of the suite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_isolated

pytestmark = pytest.mark.adversarial

PRELUDE = f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n" + """
import asyncio, json, time
from conventions import build_convention
from test_endpoint_hostile import rollout

async def ask(client, text):
    r = await client.chat.completions.create(model="p", messages=[{"role": "user", "content": text}])
    return r.choices[0].message.content

def report(out, **extra):
    print(json.dumps({"runs": [[t.stop_reason, t.error, t.requests] for t in out], **extra}))

qwen = build_convention("qwen2.5-instruct")
"""


def run(code, timeout=120):
    result = run_isolated(PRELUDE + code, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_blocking_call_in_an_async_agent_costs_its_own_trajectory():
    data = run("""
import pathlib, tempfile
folder = tempfile.mkdtemp()
pathlib.Path(folder, "slow_framework.py").write_text("import time\\ntime.sleep(2.5)\\n")
sys.path.insert(0, folder)

async def agent(client, kind, **row):
    first = await ask(client, "2+3?")
    if kind == "blocks":
        time.sleep(3.5)  # a sync tool inside async def: the whole loop stops
    elif kind == "imports":
        import slow_framework  # noqa: F401 - a first import inside async def blocks once per process: not blamed
    return first, await ask(client, "again")

ro, tok, gen = rollout(qwen, agent, env_timeout=3.0)
start = time.monotonic()
out = ro.run([{"kind": "blocks"}, {"kind": "imports"}, {"kind": "ok"}, {"kind": "ok"}], gen)
report(out, seconds=time.monotonic() - start)
""")
    (reason, error, requests), *others = data["runs"]
    assert reason == "env_error" and requests == 1
    assert error.startswith("the agent blocked the event loop for over 2.0 s at <string>:") and "in agent:" in error
    assert "plain `def`" in error and "async client" in error and "\n" not in error
    assert others == [["terminated", "", 2]] * 3  # stalled 6 s in all with env_timeout=3: not blamed
    assert data["seconds"] < 20


def test_a_block_that_never_ends_names_the_culprit_and_frees_the_round():
    data = run("""
async def agent(client, kind, **row):
    await ask(client, "2+3?")
    if kind == "blocks":
        time.sleep(25)
    return await ask(client, "again")

ro, tok, gen = rollout(qwen, agent, env_timeout=2.0)
start = time.monotonic()
out = ro.run([{"kind": "ok"}, {"kind": "blocks"}, {"kind": "ok"}], gen)
seconds = time.monotonic() - start
again = ro.run([{"kind": "ok"}] * 2, gen)  # a fresh loop serves the next round
report(out + again, seconds=seconds)
sys.stdout.flush()
import os; os._exit(0)  # the blocked thread is abandoned: do not wait for it at exit
""")
    runs = data["runs"]
    assert runs[1][0] == "env_error" and "blocked the event loop" in runs[1][1]
    for reason, error, _ in (runs[0], runs[2]):  # lost with the loop, but the error names the culprit
        assert reason == "env_timeout" and "blocked by another agent" in error and "in agent" in error, error
    assert runs[3:] == [["terminated", "", 2]] * 2
    assert data["seconds"] < 20  # not the 25 s of the block (about 8 s on 2 idle cores)
