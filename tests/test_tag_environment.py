"""TagEnvironment: parsing, stop strings, invalid actions, failing/hanging tools, sessions, real tools."""

import asyncio
import time

import pytest

from trl_agentic import TagEnvironment


def run(coro):
    return asyncio.run(coro)


def test_tool_call_and_answer():
    env = TagEnvironment(tools={"search": lambda q: f"docs for {q}"})
    assert env.stop_strings == ["</search>", "</answer>"]
    env.reset(question="q")
    result = run(env.step("<think>hm</think><search> paris </search>"))
    assert result.observation == "\n\n<information>docs for paris</information>\n\n"
    assert result.info == {"tool": ["search"]} and not result.terminated
    result = run(env.step("<answer> Paris </answer>"))
    assert result.terminated and env.answer == "Paris"


def test_per_tool_observation_tags_and_template():
    env = TagEnvironment(tools={"code": (lambda c: "4", "interpreter")}, observation_template="<{tag}>{content}</{tag}>")
    assert run(env.step("<code>print(2+2)</code>")).observation == "<interpreter>4</interpreter>"


def test_invalid_and_unknown_tool_get_corrective_message():
    env = TagEnvironment(tools={"search": str})
    result = run(env.step("I think the answer is 4"))
    assert result.info["invalid"] and not result.info["unknown_tool"] and "<search> and </search>" in result.observation
    result = run(env.step("<browse>x</browse>"))
    assert result.info["invalid"] and result.info["unknown_tool"]


def test_failing_and_hanging_tools_return_error_observations():
    def boom(q):
        raise RuntimeError("index missing")

    def hang(q):
        time.sleep(2)
        return "late"

    env = TagEnvironment(tools={"a": boom, "b": hang}, tool_timeout=0.2)
    result = run(env.step("<a>x</a>"))
    assert result.info["tool_error"] and "RuntimeError: index missing" in result.observation
    assert not result.terminated
    result = run(env.step("<b>x</b>"))
    assert result.info["tool_timeout"] and "timed out" in result.observation


def test_a_tool_that_returns_no_text_warns_once_per_tool():
    """A tool that returns None costs each call an error observation the model reads; the user is told once per
    tool (and kind of failure), not once per call, nor never."""
    import warnings

    def forgot_to_return(q):
        f"docs for {q}"  # noqa: B018 - the bug: no return

    env = TagEnvironment(tools={"search": forgot_to_return})
    with pytest.warns(RuntimeWarning, match=r"the search tool \(.*forgot_to_return\) returned NoneType, not text: "
                                            r"the model reads an error observation .* make it return a str"):
        result = run(env.step("<search> paris </search>"))
    assert result.info["tool_error"] and "returned NoneType, not text" in result.observation
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second call, or another instance of the environment: no second warning
        again = TagEnvironment(tools={"search": forgot_to_return})
        assert run(again.step("<search> rome </search>")).info["tool_error"]


def test_huge_tool_output_is_cut_inside_the_tags(tokenizer):
    """The engine caps the tool output's tokens inside the observation tags: both tags survive."""
    from helpers import ScriptedGenerator

    from trl_agentic import RolloutConfig
    from trl_agentic.rollout.engine import RolloutEngine

    def make_env():
        return TagEnvironment(tools={"search": lambda q: "word " * 100_000})

    gen = ScriptedGenerator(tokenizer, lambda ids: "<search>q</search>")
    engine = RolloutEngine(gen, tokenizer, make_env, RolloutConfig(max_turns=2, max_observation_tokens=50,
                                                                    max_completion_length=400))
    [t] = engine.run(["p"], [{}])
    assert t.events["observation_truncated"] == 1
    assert t.observations[0].startswith("\n\n<information>word word")
    assert t.observations[0].endswith("[truncated]</information>\n\n")
    content = t.observations[0].split("<information>")[1].split("</information>")[0]
    assert len(tokenizer(content, add_special_tokens=False)["input_ids"]) <= 50


def test_stateful_tool_gets_one_session_per_trajectory_and_is_closed():
    class Counter:
        opened, closed = 0, 0

        def session(self):
            Counter.opened += 1
            state = {"n": 0}

            class Session:
                def __call__(self, text):
                    state["n"] += 1
                    return str(state["n"])

                def close(self):
                    Counter.closed += 1

            return Session()

    tool = Counter()
    env = TagEnvironment(tools={"code": tool})
    assert run(env.step("<code>a</code>")).observation.strip() == "<information>1</information>"
    assert run(env.step("<code>b</code>")).observation.strip() == "<information>2</information>"
    run(env.close())
    assert (Counter.opened, Counter.closed) == (1, 1)


def test_python_sandbox_session_keeps_state_and_reports_timeouts():
    from trl_agentic.tools import PythonSandbox

    sandbox = PythonSandbox(timeout=1.0)
    env = TagEnvironment(tools={"code": (sandbox, "interpreter")})

    async def episode():  # one event loop for the episode, as the rollout engine runs it
        try:
            await env.step("<code>x = 20</code>")
            second = await env.step("<code>print(x + 1)</code>")
            third = await env.step("<code>while True: pass</code>")
        finally:
            await env.close()
        return second, third

    try:
        second, third = run(episode())
    finally:
        sandbox.close()
    assert "21" in second.observation and not second.info["tool_error"]
    assert third.info["tool_timeout"] and third.info["tool_error"]


def test_calculator_tool():
    from trl_agentic.tools import Calculator

    env = TagEnvironment(tools={"calc": (Calculator(), "result")}, observation_template="<{tag}>{content}</{tag}>")
    assert run(env.step("<calc>3 * (4 + 5)</calc>")).observation == "<result>27</result>"
    result = run(env.step("<calc>__import__('os')</calc>"))
    assert result.info["tool_error"] and result.observation.startswith("<result>Error")


def test_lookup_answers_only_the_asked_key():
    from trl_agentic.toy import LookupEnvironment

    env = LookupEnvironment()
    env.reset(key="k5", value="3")
    assert run(env.step("<lookup>k5</lookup>")).observation == "<result>3</result>"
    assert run(env.step("<lookup>k6</lookup>")).observation == "<result>not found</result>"


@pytest.mark.parametrize("action, expected", [
    ("<search>x</search>", {"tool": ["search"], "tool_error": 0, "tool_timeout": 0}),
    ("<boom>x</boom>", {"tool": [], "invalid": 1, "unknown_tool": 1}),
    ("<fail>x</fail>", {"tool": ["fail"], "tool_error": 1}),
])
def test_step_info_holds_the_typed_keys_as_counts(action, expected):
    """``StepResult.info``: the keys the library reads (:class:`~trl_agentic.environments.base.StepInfo`) are ints (counts)
    and ``tool`` a list, whatever the tool reported."""
    import asyncio

    from trl_agentic.environments.base import StepInfo
    from trl_agentic.tools import ToolOutput

    def fail(query: str) -> str:
        raise RuntimeError("down")

    env = TagEnvironment(tools={"search": (lambda q: ToolOutput("found"), "information"), "fail": (fail, "result")})
    env.reset()
    info = asyncio.run(env.step(action)).info
    assert {k: info[k] for k in expected} == expected
    for key, kind in StepInfo.__annotations__.items():
        if key in info:
            assert type(info[key]) is (list if "list" in str(kind) else int), (key, info[key])
