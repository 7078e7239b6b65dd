import pytest

from trl_agentic.rewards import ToolUseReward, extract_tool_calls, make_samples


def call(reward, trajectories=None, completions=None, **columns):
    n = len(trajectories or completions)
    completions = completions or ["unused"] * n
    kwargs = {"trajectory": trajectories} if trajectories else {}
    return reward(prompts=["q"] * n, completions=completions, **kwargs, **columns)


def test_required_tool_called(trajectory):
    reward = ToolUseReward(required_tools={"search"})
    used = trajectory(["<think>a</think><search>capital</search>", "<answer>Paris</answer>"],
                      turn_infos=[{"tool": ["search"]}, {"answer": "Paris"}])
    skipped = trajectory(["<answer>Paris</answer>"], turn_infos=[{"answer": "Paris"}])
    assert call(reward, [used, skipped]) == [0.5, 0.0]


def test_tool_name_matching_is_jaccard(trajectory):
    # needs {search, code}; called {search, calculator} -> |{search}| / |{search, code, calculator}| = 1/3
    reward = ToolUseReward(need_reward=0.3, clip=(-1, 1))
    traj = trajectory(["<search>a</search>", "<calculator>1+1</calculator>"],
                      turn_infos=[{"tool": ["search"]}, {"tool": ["calculator"]}])
    assert call(reward, [traj], required_tools=[["search", "code"]]) == [pytest.approx(0.1)]


def test_required_column_per_row_and_no_tool_needed(trajectory):
    reward = ToolUseReward()
    no_call = trajectory(["<answer>4</answer>"], turn_infos=[{}])
    searched = trajectory(["<search>q</search>"], turn_infos=[{"tool": ["search"]}])
    # a row that needs no tool rewards not calling one; a row with no information skips the need term
    assert call(reward, [no_call, searched, searched], required_tools=[[], [], None]) == [0.5, 0.0, 0.0]
    assert call(reward, [searched], required_tools=["search"]) == [0.5]


def test_unknown_invalid_and_duplicate_penalties(trajectory):
    reward = ToolUseReward(known_tools={"search"}, clip=(-10, 10))
    unknown = trajectory(["<browse>x</browse>"], turn_infos=[{"tool": ["browse"]}])
    reported_unknown = trajectory(["<python>1</python>"], turn_infos=[{"invalid": True, "unknown_tool": True}])
    invalid = trajectory(["I will search now"], turn_infos=[{"invalid": True}])
    duplicate = trajectory(["<think>a</think><search>paris</search>", "<think>b</think><search> paris </search>",
                            "<search>lyon</search>", "<search>paris</search>"],
                           turn_infos=[{"tool": ["search"]}] * 4)
    assert call(reward, [unknown, reported_unknown, invalid, duplicate]) == [-0.25, -0.25, -0.25, -0.25]
    assert extract_tool_calls(make_samples(["q"], ["x"], {"trajectory": [reported_unknown]})[0])[0].name == "python"


def test_tool_errors_are_not_penalized(trajectory):
    traj = trajectory(["<code>1/0</code>"], turn_infos=[{"tool": ["code"], "tool_error": True}])
    assert call(ToolUseReward(), [traj]) == [0.0]


def test_cap_bounds_accumulated_penalties(trajectory):
    reward = ToolUseReward(clip=(-0.5, 0.5))
    spam = trajectory(["<search>same</search>"] * 50, turn_infos=[{"tool": ["search"]}] * 50)
    assert call(reward, [spam]) == [-0.5]
    with pytest.raises(ValueError):
        ToolUseReward(clip=(1, -1))


def test_parses_text_without_trajectory():
    reward = ToolUseReward(required_tools={"code"}, clip=(-10, 10))
    text = ("<think>a</think><search>x</search><information>doc <search>y</search></information>"
            "<search>x</search><information>doc</information><code></code><interpreter>err</interpreter>")
    calls = extract_tool_calls(make_samples(["q"], [text], {})[0])
    assert [(c.name, c.arguments, c.invalid) for c in calls] == [("search", "x", False), ("search", "x", False),
                                                                  ("code", "", True)]
    # one duplicate, one invalid (empty code block), no valid code call -> need term 0 / |{code, search}|
    assert call(reward, completions=[text]) == [-0.5]


def test_parses_tags_in_chat_messages_without_tool_calls():
    completion = [{"role": "assistant", "content": "<search>a</search>"},
                  {"role": "user", "content": "<information>doc</information>"},
                  {"role": "assistant", "content": "<search>a</search>"}]
    assert call(ToolUseReward(required_tools={"search"}), completions=[completion]) == [0.25]  # need 0.5, dup -0.25


def test_reads_trl_chat_tool_calls():
    reward = ToolUseReward(known_tools={"search"}, required_tools={"search"}, clip=(-10, 10))
    completion = [
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "search", "arguments": {"query": "paris"}}},
            {"type": "function", "function": {"name": "weather", "arguments": {}}},
        ]},
        {"role": "tool", "name": "search", "content": "Paris is the capital"},
        {"role": "tool", "name": "weather", "content": "{'error': 'Tool weather not found.'}"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "search", "arguments": {"q": 1}}}]},
        {"role": "tool", "name": "search", "content": "{'error': \"search() got an unexpected keyword argument 'q'\"}"},
        {"role": "assistant", "content": "Paris"},
    ]
    # need 0.5 * 1 (search called validly once), unknown weather -0.25 (not also invalid), invalid search -0.25
    assert call(reward, completions=[completion]) == [0.0]
