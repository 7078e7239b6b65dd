"""Misbehaving environments cost their own trajectory, never the batch, the run or the next run.

Each scenario that could hang runs in a child process (helpers.run_isolated): a hang fails the test after a timeout.
"""

import json

import pytest
from helpers import EchoEnvironment, ScriptedGenerator, run_isolated

from trl_agentic import RolloutConfig, StepResult
from trl_agentic.rollout.engine import RolloutEngine

PRELUDE = """
import json, sys, time, asyncio
from helpers import EchoEnvironment, ScriptedGenerator
from trl_agentic import RolloutConfig, StepResult
from trl_agentic.rollout.engine import RolloutEngine
from trl_agentic.toy import build_tokenizer
tok = build_tokenizer()

def engine(factory, timeout=0.5, turns=2):
    gen = ScriptedGenerator(tok, lambda ids: "act")
    return RolloutEngine(gen, tok, factory, RolloutConfig(max_turns=turns, env_timeout=timeout))

def report(trajs):
    print(json.dumps([[t.stop_reason, t.num_turns, t.error] for t in trajs]))
"""


def _last_json(result):
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("exc", ["KeyboardInterrupt", "SystemExit", "GeneratorExit", "asyncio.CancelledError"])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_base_exceptions_in_step_cost_one_trajectory_and_the_next_run_works(exc, kind):
    code = PRELUDE + f"""
class Bad(EchoEnvironment):
    {'async ' if kind == 'async' else ''}def step(self, action):
        if self.fail:
            raise {exc}()
        return EchoEnvironment.step(self, action)

first = engine(Bad).run(["p", "q"], [{{"fail": True}}, {{}}])
second = engine(Bad).run(["p"], [{{}}])  # the same process: the event loop must still serve
report(first + second)
"""
    first_bad, first_good, second = _last_json(run_isolated(code, timeout=60))
    assert first_bad[0] == "env_error" and exc.split(".")[-1] in first_bad[2]
    assert first_good[:2] == ["terminated", 2] and second[:2] == ["terminated", 2]


def test_hung_sync_steps_do_not_starve_later_batches():
    """Before: hung steps held the default executor's threads (6 on 2 cores), so the next batch's healthy
    environments timed out too."""
    code = PRELUDE + """
class Hang(EchoEnvironment):
    def step(self, action):
        if self.fail:
            time.sleep(1000)
        time.sleep(0.05)
        return EchoEnvironment.step(self, action)

hung = engine(Hang).run(["p"] * 16, [{"fail": True}] * 16)
start = time.perf_counter()
healthy = engine(Hang, timeout=2.0).run(["p"] * 16, [{}] * 16)
print("seconds", time.perf_counter() - start, file=sys.stderr)
report(hung + healthy)
"""
    rows = _last_json(run_isolated(code, timeout=90))
    assert all(r[0] == "env_timeout" for r in rows[:16])
    assert all(r[:2] == ["terminated", 2] for r in rows[16:])


def test_async_step_that_blocks_the_loop_costs_its_batch_not_the_next():
    code = PRELUDE + """
class Blocking(EchoEnvironment):
    async def step(self, action):
        if self.fail:
            time.sleep(8)  # blocks the event loop: no timeout can preempt it
        return EchoEnvironment.step(self, action)

start = time.perf_counter()
first = engine(Blocking, timeout=0.3).run(["p", "q"], [{"fail": True}, {}])
elapsed = time.perf_counter() - start
second = engine(Blocking, timeout=0.3).run(["p"], [{}])
report(first + second)
print(json.dumps(elapsed))
"""
    result = run_isolated(code, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    rows, elapsed = (json.loads(line) for line in result.stdout.strip().splitlines()[-2:])
    assert rows[0][0] == "env_error" and rows[0][2].startswith("Blocking.step blocked the event loop for over ")
    assert rows[1][0] == "env_timeout" and "blocked by Blocking.step" in rows[1][2]  # lost with the loop, not blamed
    assert rows[2][:2] == ["terminated", 2]  # a fresh loop serves the next batch
    assert elapsed < 8  # the batch did not wait for the blocked loop


def test_an_async_step_that_blocks_the_loop_is_named_and_costs_its_own_trajectory():
    """The watchdog beside the environments' loop names the step and the line that blocks; the steps it stalled are
    not timed out for the time it held the loop."""
    code = PRELUDE + """
class Blocking(EchoEnvironment):
    async def step(self, action):
        await asyncio.sleep(0.1 if self.fail else 0.5)
        if self.fail:
            time.sleep(3)  # a sync call inside async def: the whole loop stops
        else:
            await asyncio.sleep(0.5)
        return EchoEnvironment.step(self, action)

report(engine(Blocking, timeout=2.5).run(["p", "q", "r"], [{"fail": True}, {}, {}]))
"""
    rows = _last_json(run_isolated(code, timeout=90))
    assert rows[0][0] == "env_error" and rows[0][1] == 1, rows[0]
    assert rows[0][2].startswith("Blocking.step blocked the event loop for over 2.0 s at <string>:")
    assert "in step:" in rows[0][2] and "plain `def`" in rows[0][2] and "async client" in rows[0][2]
    assert rows[1][:2] == rows[2][:2] == ["terminated", 2]  # 3.6 s per step with env_timeout=2.5: not blamed


def test_real_ctrl_c_stops_the_run_promptly():
    code = PRELUDE + """
import signal, threading, os
class Slow(EchoEnvironment):
    def step(self, action):
        time.sleep(30)
        return EchoEnvironment.step(self, action)

# A shell starts background jobs with SIGINT ignored, and Python then installs no KeyboardInterrupt handler: give
# this process the one an interactive run has, whatever the test runner inherited.
signal.signal(signal.SIGINT, signal.default_int_handler)
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
start = time.perf_counter()
try:
    engine(Slow, timeout=60).run(["p"] * 4, [{}] * 4)
    print(json.dumps("no interrupt"))
except KeyboardInterrupt:
    print(json.dumps(time.perf_counter() - start))
"""
    elapsed = _last_json(run_isolated(code, timeout=60))
    assert isinstance(elapsed, float) and elapsed < 5


BAD_RETURNS = {
    "int observation": "StepResult(observation=7)",
    "bytes observation": "StepResult(observation=b'abc')",
    "lone surrogate": "StepResult(observation='ok \\ud800 bad')",
    "None info": "StepResult(observation='x', info=None)",
    "NaN reward": "StepResult(observation='x', reward=float('nan'))",
    "a count as text": "StepResult(observation='x', info={'tool_error': '1'})",
    "a negative count": "StepResult(observation='x', info={'invalid': -1})",
    "tool names not a list": "StepResult(observation='x', info={'tool': 'search'})",
    "string reward": "StepResult(observation='x', reward='1')",
    "tuple": "('obs', 0.0, False)",
    "None": "None",
}


@pytest.mark.parametrize("name", sorted(BAD_RETURNS))
def test_ill_typed_step_result_costs_one_trajectory_with_a_clear_error(tokenizer, name):
    value = BAD_RETURNS[name]

    class Bad(EchoEnvironment):
        def step(self, action):
            if self.fail:
                return eval(value)  # noqa: S307 - a fixed expression of this test
            return super().step(action)

    gen = ScriptedGenerator(tokenizer, lambda ids: "act")
    bad, good = RolloutEngine(gen, tokenizer, Bad, RolloutConfig(max_turns=2)).run(["p", "q"], [{"fail": True}, {}])
    assert bad.stop_reason == "env_error" and bad.truncated and bad.events["env_error"] == 1
    assert "Bad.step()" in bad.error  # names the environment (and the field, see below)
    assert good.stop_reason == "terminated" and good.num_turns == 2


def test_error_message_names_field_and_type(tokenizer):
    class Bad(EchoEnvironment):
        def step(self, action):
            return StepResult(observation=b"abc")

    gen = ScriptedGenerator(tokenizer, lambda ids: "act")
    [t] = RolloutEngine(gen, tokenizer, Bad, RolloutConfig(max_turns=2)).run(["p"], [{}])
    assert "Bad.step().observation must be a str or None, got bytes" in t.error


def test_info_keys_the_library_reads_are_typed_and_named(tokenizer):
    """Issue 53: ``StepResult.info`` is read through one typed reader; a wrong type is an error naming the key, not a
    silent coercion (``int("1" or 0)`` once counted a text "1" as one tool error)."""
    from trl_agentic.environments.base import EnvironmentOutputError, read_info

    class Bad(EchoEnvironment):
        def step(self, action):
            return StepResult(observation="x", info={"tool_error": "1"})

    gen = ScriptedGenerator(tokenizer, lambda ids: "act")
    [t] = RolloutEngine(gen, tokenizer, Bad, RolloutConfig(max_turns=2)).run(["p"], [{}])
    assert t.stop_reason == "env_error"
    assert "Bad.step().info['tool_error'] must be a count (an int >= 0 or a bool), got '1' (str)" in t.error
    info = read_info({"tool": ["search"], "tool_error": True, "custom": object()})  # other keys are the env's own
    assert (info.tool, info.tool_error, info.tool_calls, info.reports_tools) == (("search",), 1, 0, True)
    assert not read_info({}).reports_tools
    with pytest.raises(EnvironmentOutputError, match=r"^StepResult.info\['calls'\] must be a list"):
        read_info({"calls": "f(x)"})


def test_failing_factory_and_bad_reset_cost_one_trajectory(tokenizer):
    calls = {"n": 0}

    def factory():
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("no sandbox left")
        return EchoEnvironment()

    class BadReset(EchoEnvironment):
        def reset(self, **row):
            return 42 if row.get("bad") else None

    gen = ScriptedGenerator(tokenizer, lambda ids: "act")
    first, second = RolloutEngine(gen, tokenizer, factory, RolloutConfig(max_turns=2)).run(["p", "q"], [{}, {}])
    assert first.stop_reason == "env_error" and "no sandbox left" in first.error and first.num_turns == 0
    assert second.stop_reason == "terminated"
    bad, good = RolloutEngine(gen, tokenizer, BadReset, RolloutConfig(max_turns=2)).run(["p", "q"], [{"bad": 1}, {}])
    assert bad.stop_reason == "env_error" and "reset() return value must be a str or None, got int" in bad.error
    assert good.stop_reason == "terminated"


def test_garbage_tool_output_is_an_error_observation_not_a_crash(tokenizer):
    from trl_agentic import TagEnvironment

    def make():
        return TagEnvironment(tools={"search": lambda q: {"not": "text"}, "code": lambda c: "ok \ud800"})

    script = iter(["<search>x</search>", "<code>1</code>", "<answer>1</answer>"])
    gen = ScriptedGenerator(tokenizer, lambda ids: next(script))
    [t] = RolloutEngine(gen, tokenizer, make, RolloutConfig(max_turns=3, max_completion_length=300)).run(["p"], [{}])
    assert t.stop_reason == "terminated" and t.turn_infos[0]["tool_error"]
    assert "returned dict, not text" in t.observations[0] and "\ud800" not in t.observations[1]


def test_trajectories_with_lone_surrogates_are_saved_and_loaded_back(tmp_path):
    from trl_agentic import Trajectory
    from trl_agentic.trajectory import load_trajectories, save_trajectories

    t = Trajectory(prompt_ids=[1], actions=["bad \ud800 text"], observations=["ok"])
    save_trajectories([t], tmp_path / "t.jsonl")
    (row,) = load_trajectories(tmp_path / "t.jsonl")
    assert row["actions"] == ["bad \ud800 text"]


def test_tools_the_chat_template_cannot_describe_cost_their_trajectory():
    """A native-tool environment whose tools (read after reset, per row) cannot be rendered by the chat template ends
    its own trajectory with env_error, named in one line; the batch's other trajectories run (issue 58: the engine
    raised out of the rollout)."""
    from conventions import build_convention
    from helpers import native_call

    from trl_agentic.environments.native_tools import ToolCallEnvironment

    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return a + b

    def undocumented(a):  # no docstring, no type hint: transformers cannot write its schema
        return a

    class PerRowTools(ToolCallEnvironment):
        def reset(self, broken: bool, **row) -> None:
            self.tools = [add, undocumented] if broken else [add]

    qwen = build_convention("qwen2.5-instruct")
    tok = qwen.load_tokenizer()
    turns = iter([native_call("add", a=1, b=2), "3"])
    generator = ScriptedGenerator(tok, lambda ids: next(turns) + "<|im_end|>")
    engine = RolloutEngine(generator, tok, PerRowTools, RolloutConfig(rollout_mode="chat", max_turns=3,
                                                                       max_completion_length=200))
    prompt = [{"role": "user", "content": "What is 1 plus 2?"}]
    broken, fine = engine.run([prompt, prompt], [{"broken": True}, {"broken": False}])
    assert broken.stop_reason == "env_error" and "undocumented" in broken.error and "\n" not in broken.error
    assert fine.stop_reason == "terminated" and fine.num_turns == 2
