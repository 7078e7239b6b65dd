"""An ``async def`` agent that blocks the agents' event loop (hostile tests, written first): the block costs the
blocking agent's trajectory alone, named with its line, and no other trajectory is lost. A short block stalls the
others for its length; a block past ``env_timeout`` (10 s, 45 s) gives the loop up, and the round's other agents start
again on a fresh loop and finish. All in one child process (a hang fails the test, not the suite), the blocks side by
side in one round."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_isolated

pytestmark = pytest.mark.adversarial

PRELUDE = f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n" + """
import asyncio, json, os, pathlib, tempfile, threading, time
from conventions import build_convention
from test_endpoint_hostile import rollout

async def ask(client, text):
    r = await client.chat.completions.create(model="p", messages=[{"role": "user", "content": text}])
    return r.choices[0].message.content

def report(out, **extra):
    print(json.dumps({"runs": [[t.stop_reason, t.error, t.requests, t.events.get("restarted", 0)] for t in out],
                      **extra}))

qwen = build_convention("qwen2.5-instruct")
"""


def run(code, timeout=120):
    result = run_isolated(PRELUDE + code, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_blocks_of_10_and_45_seconds_cost_only_the_blocking_agents():
    data = run("""
folder = tempfile.mkdtemp()
pathlib.Path(folder, "slow_framework.py").write_text("import time\\ntime.sleep(2.5)\\n")
sys.path.insert(0, folder)
shared = {"lock": asyncio.Lock()}  # bound to the loop that first needs it: the agents share one loop

async def agent(client, kind, **row):
    first = await ask(client, "2+3?")
    async with shared["lock"]:
        pass
    if kind == "sleeps 1 s":
        time.sleep(1)  # shorter than the watchdog's 2 s: the others wait for it, nobody is blamed
    elif kind == "imports":
        import slow_framework  # noqa: F401 - a first import inside async def blocks once per process: not blamed
    elif kind == "sleeps 10 s":
        time.sleep(10)  # a sync call inside async def
    elif kind == "blocks 45 s":
        threading.Event().wait(45)  # a blocking wait (a sync SDK, a lock)
    return first, await ask(client, "again")

kinds = ["ok", "sleeps 1 s", "sleeps 10 s", "imports", "ok", "blocks 45 s", "ok"]
ro, tok, gen = rollout(qwen, agent, env_timeout=2.0)
start = time.monotonic()
out = ro.run([{"kind": k} for k in kinds], gen)
seconds = time.monotonic() - start
shared["lock"] = asyncio.Lock()
again = ro.run([{"kind": "ok"}] * 2, gen)  # the blocked threads are still stuck: the next round runs regardless
report(out + again, seconds=seconds)
sys.stdout.flush()
os._exit(0)  # the blocked threads are abandoned: do not wait for them at exit
""")
    runs = data["runs"]
    for i in (2, 5):  # the blocking agents: their own trajectories, named
        reason, error, requests, _ = runs[i]
        assert reason == "env_error" and requests == 1, runs[i]
        assert error.startswith("the agent blocked the event loop for over 2.0 s at <string>:") and "in agent:" in error
        assert "plain `def`" in error and "async client" in error and "\n" not in error
    for i in (0, 1, 3, 4, 6, 7, 8):  # every other agent finishes, whole (some after starting again)
        assert runs[i][:3] == ["terminated", "", 2], (i, runs[i])
    assert sum(r[3] for r in runs) >= 4  # the loop was given up, and the others started again on a fresh one
    assert data["seconds"] < 30  # the blocks last 10 s and 45 s; each gives its loop up after 4 s
