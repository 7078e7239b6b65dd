"""The library's tasks (trl_agentic.tasks): prompts, environments and rewards end to end through the rollout engine,
and data loading with one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trl_agentic.tasks import GSM8KToolsArguments, SearchR1Arguments, TaskConfigError, build_task, load_rows
from trl_agentic.tasks import search_r1 as search_r1_task
from trl_agentic.tasks.gsm8k import PYTHON_SYSTEM_PROMPT

FIXTURES = Path(__file__).resolve().parents[1] / "recipes" / "fixtures"
SHARED = Path(__file__).resolve().parents[3] / "shared"


def _scripted_rollout(tokenizer, factory, turns: list[str], prompt, row: dict):
    from helpers import ScriptedGenerator

    from trl_agentic import run_rollouts

    calls = []

    def script(prompt_ids):  # one trajectory: the k-th generation call is turn k
        calls.append(prompt_ids)
        return turns[min(len(calls) - 1, len(turns) - 1)]

    (trajectory,) = run_rollouts(None, tokenizer, factory, [{**row, "prompt": prompt}],
                                 generator=ScriptedGenerator(tokenizer, script), max_turns=4,
                                 max_tokens_per_turn=200, max_completion_length=600, max_observation_tokens=400)
    return trajectory


def _score(reward, trajectory, row):
    columns = {k: [v] for k, v in row.items() if k != "prompt"}
    logged = {}
    values = reward(prompts=["p"], completions=["".join(trajectory.actions)], trajectory=[trajectory],
                    log_metric=lambda name, value: logged.__setitem__(name, value), **columns)
    return values[0], logged


def test_gsm8k_python_task_end_to_end(tokenizer):
    row = json.loads((FIXTURES / "gsm8k_small.jsonl").read_text().splitlines()[0])  # Janet's ducks: 18
    turns = ["Eggs left to sell: <code>\nleft = 16 - 3 - 4\nprint(left * 2)\n</code>",
             "So she makes <answer>18</answer>"]
    with build_task("gsm8k_tools", GSM8KToolsArguments(sandbox_pool_size=0)) as task:
        trajectory = _scripted_rollout(tokenizer, task.environment, turns, "question\n", row)
        assert trajectory.stop_reason == "terminated" and trajectory.num_turns == 2
        assert trajectory.observations[0] == "\n\n<interpreter>18\n</interpreter>\n\n"
        (reward,) = task.reward_funcs
        total, logged = _score(reward, trajectory, row)
        assert logged["reward/correct"] == 1.0 and logged["reward/format"] == 1.0 and logged["reward/tool_use"] == 0.5
        assert total == pytest.approx(1.0 + 0.2 * 1.0 + 0.1 * 0.5)
        assert _score(task.success, trajectory, row)[0] == 1.0
    assert task.resources == []  # closed by the with block


def test_gsm8k_calculator_task_wrong_answer(tokenizer):
    task = build_task("gsm8k_tools", GSM8KToolsArguments(tool="calculator", length_weight=0.1), 600)
    row = {"question": "q", "answer": "#### 18"}
    turns = ["<calc>(16 - 3 - 4) * 2</calc>", "<answer>17</answer>"]
    trajectory = _scripted_rollout(tokenizer, task.environment, turns, "question\n", row)
    assert trajectory.observations[0] == "\n\n<result>18</result>\n\n"
    _, logged = _score(task.reward_funcs[0], trajectory, row)
    assert logged["reward/correct"] == 0.0 and logged["reward/format"] == 1.0 and "reward/length" in logged
    assert _score(task.success, trajectory, row)[0] == 0.0


def test_protocol_format_reward_ignores_chat_template_text():
    """In chat mode an observation carries the template's tokens; ProtocolFormatReward scores only what the model
    wrote and the bare observation block (the plain FormatReward penalises every tool call)."""
    from trl_agentic import Trajectory
    from trl_agentic.rewards import RETOOL_TAGS, FormatReward, ProtocolFormatReward

    t = Trajectory(prompt_ids=[1], actions=["First <code>print(9)</code>", "So <answer>9</answer>"],
                   observations=[("<|im_end|>\n<|im_start|>tool\n\n\n<interpreter>9\n</interpreter>\n\n<|im_end|>\n"
                                  "<|im_start|>assistant\n"), None])
    kwargs = {"prompts": ["p"], "completions": ["x"], "trajectory": [t]}
    assert ProtocolFormatReward(RETOOL_TAGS)(**kwargs) == [1.0]
    assert FormatReward(RETOOL_TAGS)(**kwargs)[0] < 1.0
    cut = Trajectory(prompt_ids=[1], actions=t.actions, observations=["<interpreter>9 9 9 (cut by the budget", None])
    assert ProtocolFormatReward(RETOOL_TAGS)(prompts=["p"], completions=["x"], trajectory=[cut]) == [1.0]


def test_search_r1_task_end_to_end(tokenizer):
    task = build_task("search_r1", SearchR1Arguments(corpus=str(FIXTURES / "search_corpus.jsonl")))
    row = json.loads((FIXTURES / "search_questions.jsonl").read_text().splitlines()[0])  # capital of Veloria
    prompt = search_r1_task.make_prompt(row["question"], False)
    turns = ["<think>I need the capital.</think>\n<search> capital of Veloria </search>",
             "<think>It is Port Amberlin.</think>\n<answer> Port Amberlin </answer>"]
    trajectory = _scripted_rollout(tokenizer, task.environment, turns, prompt, row)
    observation = trajectory.observations[0]
    assert observation.startswith('\n\n<information>Doc 1(Title: "Veloria") Veloria is a small island nation')
    assert observation.count("Doc ") == 3 and observation.endswith("</information>\n\n")
    assert [r.__name__ for r in task.reward_funcs] == ["search_r1", "qa_em"] and task.reward_weights == [1.0, 0.0]
    assert [_score(r, trajectory, row)[0] for r in task.reward_funcs] == [1.0, 1.0]
    invalid = _scripted_rollout(tokenizer, task.environment, ["I think it is Paris.", "<answer> Paris </answer>"],
                                prompt, row)
    assert invalid.observations[0] == search_r1_task.SEARCH_R1_INVALID_MESSAGE
    assert _score(task.success, invalid, row)[0] == 0.0


def test_search_r1_prompt_is_search_r1s():
    prompt = search_r1_task.make_prompt("  who wrote the salt ledger ", chat=True)
    template = search_r1_task.SEARCH_R1_TEMPLATE
    assert prompt == [{"role": "user", "content": template.format(question="who wrote the salt ledger?")}]
    text = search_r1_task.make_prompt("Who?", chat=False)
    assert text.startswith("Answer the given question. You must conduct reasoning inside <think> and </think> first")
    assert text.endswith("For example, <answer> Beijing </answer>. Question: Who?\n")


def test_task_rows_with_and_without_chat_template(tokenizer):
    class NoTemplate:
        chat_template = None

    task = build_task("search_r1", SearchR1Arguments(corpus=str(FIXTURES / "search_corpus.jsonl")))
    data = task.rows(load_rows(str(FIXTURES / "search_questions.jsonl")), NoTemplate())
    assert set(data.column_names) == {"prompt", "question", "golden_answers"}
    assert data[2]["prompt"].endswith("Question: On which mountain does the river Ismene rise?\n")
    assert data[1]["golden_answers"] == ["Odile Marcheval", "Marcheval"]
    chat = task.rows(load_rows(str(FIXTURES / "search_questions.jsonl")), tokenizer)
    assert chat[0]["prompt"][0]["role"] == "user"
    assert search_r1_task.golden_answers({"reward_model": {"ground_truth": {"target": ["a", "b"]}}}) == ["a", "b"]


def test_local_data_folder_from_shared(tokenizer):
    """A folder with <split>.jsonl, as /work/shared/data/gsm8k."""
    folder = SHARED / "data" / "gsm8k"
    if not (folder / "test.jsonl").exists():
        pytest.skip(f"{folder} is missing (the shared data folder is expected beside the checkout)")
    task = build_task("gsm8k_tools", GSM8KToolsArguments(tool="calculator"))
    data = task.rows(load_rows(str(folder), split="test").select(range(5)), tokenizer)
    assert len(data) == 5 and set(data.column_names) == {"prompt", "question", "answer"}
    assert data[0]["prompt"][0] == {"role": "system", "content": task.instructions}
    assert data[0]["answer"].rstrip().split("#### ")[-1] == "18"
    assert build_task("gsm8k_tools", GSM8KToolsArguments(sandbox_pool_size=0)).instructions == PYTHON_SYSTEM_PROMPT


@pytest.mark.parametrize("where,flag", [
    ("missing.jsonl", "--dataset_name missing.jsonl does not exist"),
    ("folder", "holds no validation.jsonl"),
    ("bad.jsonl", "line 2 is not valid JSON"),
    ("data.txt", "unsupported file type '.txt'"),
])
def test_local_data_errors_are_one_line(tmp_path, monkeypatch, where, flag):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "train.jsonl").write_text('{"question": "q"}\n')
    (tmp_path / "bad.jsonl").write_text('{"question": "q"}\n{oops\n')
    (tmp_path / "data.txt").write_text("x")
    with pytest.raises(TaskConfigError, match=flag) as info:
        load_rows(where, split="validation")
    message = str(info.value)
    assert "\n" not in message and "--dataset_name" in message


def test_offline_hub_dataset_is_one_line_naming_the_flag(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TaskConfigError) as info:
        load_rows("nobody/no-such-dataset", flag="--dataset")
    message = str(info.value)
    assert "\n" not in message and "offline? pass --dataset with a local" in message


def test_task_option_errors():
    with pytest.raises(TaskConfigError, match="no retriever: pass --corpus"):
        build_task("search_r1", SearchR1Arguments())
    with pytest.raises(TaskConfigError, match="not both"):
        build_task("search_r1", SearchR1Arguments(corpus="c.jsonl", retriever_url="http://127.0.0.1:8000"))
    with pytest.raises(TaskConfigError, match="--task 'nope' is unknown"):
        build_task("nope")
    with pytest.raises(TaskConfigError, match="--answer_sources"):
        build_task("gsm8k_tools", GSM8KToolsArguments(tool="calculator", answer_sources=["guess"]))
