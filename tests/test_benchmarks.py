"""Every benchmark under ``benchmarks/`` at smoke size, run as a user types it (``python benchmarks/x.py ...``, from
the repository root, in its own process), and what it prints or writes checked against what its docstring promises,
so that none breaks unseen (issue 39).

The models are tiny and built here (``trl_agentic.toy``, ``tests/conventions.py``; no hub, no GGUF file), so the
figures mean nothing: their presence, their shape and the counts that are exact are what is checked. Most of each
command's time is importing torch, transformers and TRL, so the commands of the selected tests start together, a few
at a time, when the first test asks for them, and each test waits for its own.

What needs what this suite cannot give is run as far as it goes without it: ``vllm_rollout.py`` runs its
transformers side alone (``--engines`` with none), ``learning_native/model.py`` keeps a folder that already holds a
model (loading the GGUF file is ``tests/test_smollm2_real.py``'s, ``-m slow``); both vLLM benchmarks run whole in the
vLLM suite (``tests/vllm_engine/test_vllm_benchmarks.py``). ``learning_native/task.py`` is a module of
``learning_native/run.py``, not a command. Every ``--help`` is ``tests/test_cli_help.py``'s.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from forkserver import run_python

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
       "TOKENIZERS_PARALLELISM": "false", "PYTHONIOENCODING": "utf-8"}
WORKERS = 3  # commands running at once: each is mostly one busy core (one torch thread)
NUMBER = r"-?\d+(?:\.\d+)?(?:e[-+]\d+)?"
TINY_QWEN = ("--hidden", "32", "--layers", "1")  # rollout_speed.py's and agent_endpoint.py's random Qwen2
LEARNING = ("--threads", "1", "--test-size", "2", "--eval-batch-size", "4", "--sft-demos", "2", "--sft-batch-size",
            "2", "--rl-steps", "1", "--rl-prompts-per-step", "1", "--num-generations", "2", "--grad-accum", "1",
            "--topk", "1", "--max-tokens-per-turn", "48", "--max-completion-length", "200", "--lora-r", "2",
            "--eval-every", "1", "--curve-size", "2")
"""benchmarks/learning/run.py's options (learning_native/run.py's too) at smoke size: 2 held-out questions, 2 SFT
demonstrations, one RL step of one question x 2 samples, one search result, turns of at most 48 tokens."""
LEARNING_STAGES = ("closed_book", "fewshot", "sft", "sft_again", "grpo_unmasked", "ppo_turn")
NATIVE_STAGES = ("zero_shot", "sft", "grpo")


def commands(tmp: Path, data: Path, model: Path, adapter: Path) -> dict[str, list[list[str]]]:
    """The command lines of each test (``python`` and these arguments, run in order), writing under ``tmp``, the
    longest first; the learning benchmarks read the one-hop task ``data`` with the tiny ``model`` and its SFT
    ``adapter``. The learning runs take the stages the other tests run only in process (``tests/test_learning_run.py``
    and ``tests/test_learning_native.py`` run every stage through ``main``)."""
    learning = ["--data", str(data), "--model", str(model), *LEARNING]
    return {
        "rollout_speed_growth": [["benchmarks/rollout_speed.py", "growth", "--turns", "2", "--repeats", "1", "--steps",
                                  "1", *TINY_QWEN, "--batch", "2", "--group", "2",
                                  "--json", str(tmp / "growth.json")]],
        "agent_endpoint": [["benchmarks/agent_endpoint.py", "--agents", "2", "--turns", "2", "--repeats", "1",
                            *TINY_QWEN, "--json", str(tmp / "agent_endpoint.json")],
                           ["benchmarks/agent_endpoint.py", "--endpoint-only", "--agents", "2", "--turns", "2",
                            "--repeats", "1"]],
        "shared_prompt": [["benchmarks/shared_prompt.py", "--prompt-tokens", "600", "--tools", "1", "--group", "2",
                           "--turns", "2", *TINY_QWEN, "--json", str(tmp / "shared_prompt.json")]],
        "learning_run": [["benchmarks/learning/run.py", *learning, "--out", str(tmp / "learning"),
                          "--stages", ",".join(LEARNING_STAGES)],
                         ["benchmarks/learning/run.py", "--summary", "--out", str(tmp / "learning")]],
        "learning_native_run": [["benchmarks/learning/make_transfer_task.py", "--out", str(tmp / "transfer"),
                                 "--people", "12", "--test-questions", "4"],
                                ["benchmarks/learning_native/run.py", *learning, "--out", str(tmp / "native"),
                                 "--max-turns", "3", "--stages", ",".join(NATIVE_STAGES),
                                 "--transfer", str(tmp / "transfer")],
                                ["benchmarks/learning_native/report.py", "collect", str(tmp / "native"), "--results",
                                 str(tmp / "results")],
                                ["benchmarks/learning_native/report.py", "table", "--results", str(tmp / "results")],
                                ["benchmarks/learning_native/report.py", "plot", "--results", str(tmp / "results"),
                                 "--out", str(tmp / "em.png")],
                                ["benchmarks/learning_native/report.py", "curves", "--results", str(tmp / "results"),
                                 "--out", str(tmp / "curves.png")]],
        "cpu_bf16": [["benchmarks/cpu_bf16.py", "--batch", "1", "--length", "4"]],
        "long_horizon_speed": [  # the committed reports of the walk's speed run, read from a copy
            ["-c", f"import shutil; shutil.copytree('benchmarks/reports/issue59/speed', {str(tmp / 'walk_speed')!r})"],
            ["benchmarks/long_horizon/speed.py", str(tmp / "walk_speed")]],
        "long_horizon_failures": [  # a run folder of two shortest walks, written here, then sorted
            ["-c", "import json, pathlib; from benchmarks.long_horizon import walk; "
                   f"stage = pathlib.Path({str(tmp / 'walk_run' / 'sft')!r}); stage.mkdir(parents=True); "
                   "rows = walk.task_rows(20, 2, 0)['test']; "
                   "(stage / 'report.json').write_text(json.dumps({'command': 'python run.py --task walk "
                   "--train-size 20 --test-size 2'})); "
                   "(stage / 'heldout.jsonl').write_text(''.join(json.dumps({'question': r['question'], "
                   "'messages': walk.demonstration(r)}) + chr(10) for r in rows))"],
            ["benchmarks/long_horizon/failures.py", str(tmp / "walk_run")]],
        "call_graph": [["benchmarks/call_graph.py", "--trainer", "ppo", "--json", str(tmp / "call_graph.json")],
                       ["benchmarks/call_graph.py", "--json", str(tmp / "call_graph_grpo.json")]],
        "async_rollouts": [["benchmarks/async_rollouts.py", "--loads", "4", "--steps", "5", "--batch", "4",
                            "--turns", "1", "--hidden", "32", "--layers", "1", "--probe-seconds", "3",
                            "--generator", "thread", "process", "--max-staleness", "1", "2", "--json", str(tmp / "async.json")]],
        "learning_native_speed": [
            ["-c", f"import shutil; shutil.copytree({str(adapter)!r}, {str(tmp / 'speed' / 'sft' / 'adapter')!r})"],
            ["benchmarks/learning_native/speed.py", "eval", *learning, "--out", str(tmp / "speed"), "--max-turns", "3",
             "--questions", "2", "--batch", "2", "--repeats", "2"],
            ["benchmarks/learning_native/speed.py", "step", *learning, "--out", str(tmp / "speed"), "--max-turns", "3",
             "--samples", "2", "--variants", "reprefill", "grouped"],
            ["benchmarks/learning_native/speed.py", "decode", *learning, "--out", str(tmp / "speed"), "--batch", "2",
             "--context", "8", "--steps", "2"],
            ["benchmarks/learning_native/speed.py", "memory", *learning, "--out", str(tmp / "speed"),
             "--micro-batches", "1", "2", "--context", "16"]],
        "rollout_speed_trl": [["benchmarks/rollout_speed.py", "trl", "--turns", "1", "2", "--steps", "1", *TINY_QWEN,
                               "--batch", "4", "--group", "2", "--json", str(tmp / "trl.json")]],
        "critic_memory": [["benchmarks/critic_memory.py", *TINY_QWEN, "--batch", "1", "--length", "16",
                           "--options", "shared-adapter"]],
        "profile_step": [["benchmarks/learning/profile_step.py", "ppo", "--steps", "1", "--sft-adapter", str(adapter),
                          "--out", str(tmp / "profile"), *learning]],
        "convention_build": [["benchmarks/convention_build.py"]],
        "distributed_exit": [["benchmarks/distributed_exit.py", "--runs", "1", "--timeout", "300",
                              "--variants", "barrier, settle, destroy, free"]],
        "rollout_speed_hotpath": [["benchmarks/rollout_speed.py", "hotpath", "--repeats", "1",
                                   "--json", str(tmp / "hotpath.json")]],
        "rollout_speed_generation": [["benchmarks/rollout_speed.py", "generation", "--turns", "1", "2", "--repeats",
                                      "1", *TINY_QWEN, "--batch", "2", "--latency", "0",
                                      "--json", str(tmp / "generation.json")]],
        "vllm_rollout_without_vllm": [["benchmarks/vllm_rollout.py", "--engines", "--turns", "1", "2", "--batch",
                                       "2", "--repeats", "1", "--hidden", "64", "--layers", "1", "--prompt-tokens",
                                       "16", "--observation-tokens", "8", "--tokens-per-turn", "4",
                                       "--json", str(tmp / "vllm_rollout.json")]],
        "bench_math_verify": [["benchmarks/rewards/bench_math_verify.py", "--n", "8"]],
        "make_task": [["benchmarks/learning/make_task.py", "--out", str(tmp / "twohop"), "--hops", "2", "--people",
                       "24", "--test-people", "6", "--train-questions", "12", "--test-questions", "4",
                       "--check-topk", "1", "2"]],
        "bench_retrieval": [["benchmarks/tools/bench_retrieval.py", "--passages", "200", "--vocab", "500", "--queries",
                             "10", "--batch", "4", "--json"]],
        "bench_sandbox": [["benchmarks/tools/bench_sandbox.py", "--n", "2", "--pool-size", "1", "--concurrency", "1",
                           "--seconds", "0.5", "--json"]],
        "bench_code_tests": [["benchmarks/rewards/bench_code_tests.py", "--n", "2", "--workers", "1", "--pool-size",
                              "1", "--runs", "1"]],
        "learning_native_model": [["benchmarks/learning_native/model.py", "--out", str(model)]],
    }


NEEDS_MODEL = {"learning_run", "profile_step", "learning_native_model", "learning_native_run", "learning_native_speed"}
"""The tests whose commands read the learning task and the tiny model (:func:`learning_inputs`)."""


def run(argv: list[str]) -> subprocess.CompletedProcess:
    """``python`` with ``argv`` from the repository root, its output captured (a process of its own, forked from a
    server with torch, transformers and TRL imported: ``tests/forkserver.py``)."""
    return run_python(argv, env=ENV, cwd=ROOT, timeout=900)


def run_all(argvs: list[list[str]]) -> list[subprocess.CompletedProcess]:
    """Each command line in turn, up to the first that fails."""
    done = []
    for argv in argvs:
        done.append(run(argv))
        if done[-1].returncode:
            break
    return done


def learning_inputs(data: Path, out: Path, hidden_size: int = 64) -> None:
    """The one-hop task in ``data`` (``make_task.py``) and, in ``out / "model"``, the tiny random Qwen2 over a toy
    ChatML tokenizer trained on its text with SmolLM2's tool templates (``learning_native/model.py``), as
    ``tests/test_learning_native.py`` builds it; a random LoRA on it saved as an SFT adapter in ``out / "adapter"``.
    ``hidden_size``: 4 attention heads (vLLM's CPU backend needs a head of at least 32: 128)."""
    from peft import LoraConfig, get_peft_model

    from benchmarks.learning_native import model as native_model
    from benchmarks.learning_native import task as native_task
    from trl_agentic.toy import build_tiny_model, build_tokenizer

    made = run(["benchmarks/learning/make_task.py", "--out", str(data), "--people", "24", "--test-people", "6",
                "--train-questions", "12", "--test-questions", "4"])
    assert made.returncode == 0, made.stderr
    text = [json.loads(line)["contents"] for line in (data / "corpus.jsonl").read_text().splitlines()]
    text += [json.loads(line)["question"] for line in (data / "train.jsonl").read_text().splitlines()]
    text += [native_model.CHATML_TOOLS_TEMPLATE, *native_task.INSTRUCTIONS.values(),
             '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>']
    tokenizer = native_model.with_tool_template(build_tokenizer(text, vocab_size=2000))
    model = build_tiny_model(tokenizer, hidden_size=hidden_size)
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    get_peft_model(model, LoraConfig(r=2, target_modules="all-linear", task_type="CAUSAL_LM")).save_pretrained(
        out / "adapter")


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """The selected tests' commands, started in :data:`WORKERS` threads with the learning inputs (those that need
    them wait for them): ``name`` -> a future of the finished processes."""
    selected = {item.originalname.removeprefix("test_") for item in request.session.items
                if item.module is request.module}
    tmp = tmp_path_factory.mktemp("benchmarks")
    data, tiny = tmp / "onehop", tmp / "tiny"
    with ThreadPoolExecutor(WORKERS) as pool:
        inputs = pool.submit(learning_inputs, data, tiny) if selected & NEEDS_MODEL else None

        def job(name: str, argvs: list[list[str]]) -> list[subprocess.CompletedProcess]:
            if name in NEEDS_MODEL:
                inputs.result()
            return run_all(argvs)

        futures = {name: pool.submit(job, name, argvs)
                   for name, argvs in commands(tmp, data, tiny / "model", tiny / "adapter").items() if name in selected}
        yield futures
        for future in futures.values():
            future.cancel()


def outputs(runs: dict[str, Future], name: str) -> list[str]:
    """The standard output of each command of test ``name``, once all have exited 0."""
    done = runs[name].result()
    for process in done:
        assert process.returncode == 0, f"python {' '.join(process.args[1:])}: exit {process.returncode}\n" \
                                        f"{process.stderr[-3000:]}"
    return [process.stdout for process in done]


def argument(runs: dict[str, Future], name: str, flag: str) -> str:
    """The value of ``flag`` on the first command line of test ``name``."""
    args = runs[name].result()[0].args
    return args[args.index(flag) + 1]


def written(runs: dict[str, Future], name: str) -> dict:
    """The JSON file the first command of test ``name`` wrote (its ``--json``)."""
    return json.loads(Path(argument(runs, name, "--json")).read_text())


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


# -- benchmarks/*.py ---------------------------------------------------------------------------------------------


def test_convention_build(runs):
    from conventions import CONVENTIONS

    out = outputs(runs, "convention_build")[0]
    assert re.search(rf"^imports: {NUMBER} s$", out, re.M)
    for name in CONVENTIONS:
        assert re.search(rf"^{re.escape(name)}: {NUMBER} s$", out, re.M), name


def test_critic_memory(runs):
    """One option, with the baseline it is compared with: each in its own process, peak RSS and the critic's extra."""
    out = outputs(runs, "critic_memory")[0]
    assert re.search(rf"^policy-only-lora +{NUMBER} +not measured +\(policy-only\)$", out, re.M), out
    assert re.search(rf"^shared-adapter +{NUMBER} +[-+]\d+ +\(policy-only-lora\)$", out, re.M), out


def test_distributed_exit(runs):
    """The ending the trainers use (``trainer.end_training()``) ends a two-process gloo run cleanly."""
    out = outputs(runs, "distributed_exit")[0]
    assert out.splitlines()[-1] == ("barrier, settle, destroy, free: 1 of 1 ended cleanly, 0 aborted at exit, 0 hung, "
                                    "0 failed otherwise")


def test_rollout_speed_trl(runs):
    """One summary line per turn count; the three sides made identical rollouts; ours with the KV cache kept
    prefilled fewer tokens than TRL's loop (at one turn: a group's prompt once), ours re-prefilling as many."""
    (out,) = outputs(runs, "rollout_speed_trl")
    lines = [line for line in out.splitlines() if line.startswith("turns ")]
    side = rf"trl {NUMBER} \| ours {NUMBER} \({NUMBER}\) \| ours_reprefill {NUMBER} \({NUMBER}\)"
    for turns, line in zip((1, 2), lines, strict=True):
        assert re.fullmatch(rf"turns {turns}: rollout s {side}; step s trl {NUMBER} \| ours {NUMBER} \| ours_reprefill "
                            rf"{NUMBER}; prefilled tokens/trajectory trl \d+ \| ours \d+ \| ours_reprefill \d+ "
                            rf"\(\d+ completion tokens/trajectory\); a loop prefilling nothing: {NUMBER} of TRL's "
                            rf"rollout CPU s", line), line
    one, two = written(runs, "rollout_speed_trl")["results"]
    for result in (one, two):  # TRL's rollout less its prefills: above 0, below the whole
        assert 0 < result["no_prefill_bound_ratio_rollout_cpu_s"] < 1 and result["trl_prefill_cpu_s"] > 0
    assert one["identical_rollouts"] == two["identical_rollouts"] == 2  # the warm-up step and one measured
    assert one["ours_prefilled_per_trajectory"] < one["trl_prefilled_per_trajectory"]  # a group's prompt once
    assert one["ours_reprefill_prefilled_per_trajectory"] == one["trl_prefilled_per_trajectory"]
    assert two["ours_prefilled_per_trajectory"] < two["trl_prefilled_per_trajectory"]
    assert two["ours_reprefill_prefilled_per_trajectory"] == two["trl_prefilled_per_trajectory"]


def test_rollout_speed_generation(runs):
    """A row per turn count: rollout and ``generate`` times, one ``generate`` call per turn, 48 tokens per turn and 40
    per tool message."""
    (out,) = outputs(runs, "rollout_speed_generation")
    rows = written(runs, "rollout_speed_generation")["results"]
    assert json_lines(out) == rows
    assert [(r["turns"], r["generate_calls"], r["tokens_per_row"]) for r in rows] == [(1, 1, 48), (2, 2, 136)]
    assert all(r["total_s"] > 0 and r["ratio"] > 0 and r["ratio_to_limit"] > 0 for r in rows)


def test_rollout_speed_growth(runs):
    """One child process per turn count: its step's times, each turn's context and the peak memory; then the fits."""
    (out,) = outputs(runs, "rollout_speed_growth")
    report = written(runs, "rollout_speed_growth")
    (row,) = report["results"]
    assert row["turns"] == 2 and len(row["per_turn_generate_cpu_s"]) == 2 and row["completion_tokens"] == 136
    assert row["per_turn_context"][0] < row["per_turn_context"][1] and row["peak_rss_mib"] > 0
    assert set(report["fits"][0]) == {"per_call_fixed_cpu_s", "per_call_cpu_s_per_context_token",
                                      "rollout_cpu_s_per_turn", "rollout_cpu_s_per_turn_squared"}
    assert json_lines(out) == [*report["results"], *report["fits"]]


def test_rollout_speed_hotpath(runs):
    """A cost per unit for each piece of the loop's bookkeeping, printed and written."""
    (out,) = outputs(runs, "rollout_speed_hotpath")
    costs = written(runs, "rollout_speed_hotpath")["microseconds"]
    lines = out.splitlines()
    assert len(lines) == len(costs) >= 15
    for line, (name, value) in zip(lines, costs.items()):
        assert re.fullmatch(rf" *{NUMBER}  {re.escape(name)}", line) and value > 0, line


def test_agent_endpoint(runs):
    """Both sides at 2 agents (identical trajectories, one ``generate`` call per turn each), and the endpoint alone."""
    both, endpoint = outputs(runs, "agent_endpoint")
    (row,) = written(runs, "agent_endpoint")["results"]
    assert (row["agents"], row["environment_generate_calls"], row["agent_generate_calls"]) == (2, 2, 2)
    assert row["environment_s"] > 0 and row["agent_s"] > 0
    assert re.search(rf"^ +2 +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER} +2 / 2 ", both,
                     re.M), both
    (alone,) = json_lines(endpoint)
    assert (alone["agents"], alone["requests"]) == (2, 4) and alone["cpu_ms_per_request"] > 0


def test_shared_prompt(runs):
    """A group of 2 agents sending one long prompt, both sides (the script checks that their trajectories are
    identical): the same prompt ids; the cache prefills fewer ids per trajectory than a cache kept per trajectory
    would, which prefills fewer than re-prefilling; it holds fewer positions than one entry per trajectory would."""
    (out,) = outputs(runs, "shared_prompt")
    report = written(runs, "shared_prompt")
    reprefill, cache = report["results"]["reprefill"], report["results"]["cache"]
    assert report["prompt_tokens"] >= 600 and report["command"].startswith("python benchmarks/shared_prompt.py ")
    assert reprefill["prompt_tokens_per_trajectory"] == cache["prompt_tokens_per_trajectory"] \
        == reprefill["prefilled_per_trajectory"]
    assert cache["prefilled_per_trajectory"] < cache["per_trajectory_cache_prefilled_per_trajectory"] \
        < reprefill["prefilled_per_trajectory"]
    assert 0 < cache["peak_cached_tokens"] < cache["per_trajectory_entries_tokens"]
    assert reprefill["peak_cached_tokens"] == 0 and reprefill["wall_s"] > 0 and cache["wall_s"] > 0
    for name in ("reprefill", "cache"):
        assert re.search(rf"^ *{name} +{NUMBER} +{NUMBER} +\d+ +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER}$",
                         out, re.M), out


def test_vllm_rollout_without_vllm(runs):
    """The transformers side alone: its time and prefilled tokens per turn count; keeping the KV cache across turns,
    the second turn prefills only what it appended, fewer tokens than the first."""
    (out,) = outputs(runs, "vllm_rollout_without_vllm")
    one, two = written(runs, "vllm_rollout_without_vllm")["results"]
    assert [one["turns"], two["turns"]] == [1, 2] and one["same_streams"] == {}
    assert one["agent_tokens_per_trajectory"] == 4 and two["agent_tokens_per_trajectory"] == 8
    first = one["prefilled_tokens_per_trajectory"]["hf"]
    assert first < two["prefilled_tokens_per_trajectory"]["hf"] < 2 * first
    assert "| turns | hf s | prefilled/traj hf |" in out
    assert re.search(rf"^\| 2 \| {NUMBER} \| \d+ \|$", out, re.M), out


# -- benchmarks/learning, benchmarks/learning_native -------------------------------------------------------------


def test_make_task(runs):
    """The two-hop files in Search-R1's formats, and one-search recall per k."""
    (out,) = outputs(runs, "make_task")
    folder = Path(argument(runs, "make_task", "--out"))
    assert out.splitlines()[0] == f"wrote {folder}/corpus.jsonl, train.jsonl, test.jsonl, train_onehop.jsonl"
    for k in (1, 2):
        assert re.search(rf"^test questions whose answer is in the top {k} of one search with the question: "
                         rf"{NUMBER} \(4 questions\)$", out, re.M), out
    rows = {name: [json.loads(line) for line in (folder / f"{name}.jsonl").read_text().splitlines()]
            for name in ("corpus", "train", "test", "train_onehop")}
    assert [len(rows[name]) for name in ("corpus", "train", "test", "train_onehop")] == [24, 12, 4, 12]
    assert all(len(row["queries"]) == 2 and row["golden_answers"] for row in rows["train"] + rows["test"])


def test_learning_run(runs):
    """Its stages on the tiny model: a report and a line each, adapters, curves and their plot, the table; then
    ``--summary`` prints the same table."""
    out, summary = outputs(runs, "learning_run")
    folder = Path(argument(runs, "learning_run", "--out"))
    for stage in LEARNING_STAGES:
        report = json.loads((folder / stage / "report.json").read_text())
        assert 0 <= report["em"] <= 1 and report["seconds"] > 0, stage
        assert re.search(rf"^== {stage}: EM {NUMBER}  searches {NUMBER}  turns {NUMBER}  \({NUMBER} min\)$", out,
                         re.M), stage
    for stage in ("grpo_unmasked", "ppo_turn"):
        assert (folder / stage / "adapter" / "adapter_config.json").exists(), stage
        curves = json.loads((folder / stage / "report.json").read_text())["curves"]
        assert curves["step"] == [1] and [row[0] for row in curves["eval"]] == [0, 1], stage
    assert (folder / "curves.png").read_bytes()[:4] == b"\x89PNG"
    table = summary.strip()
    assert table.splitlines()[0] == "| stage | EM | mean searches | mean turns | minutes |"
    assert len(table.splitlines()) == 2 + len(LEARNING_STAGES) and out.rstrip().endswith(table)


def test_profile_step(runs):
    """The PPO stage's step, from a saved SFT adapter: peak memory and the seconds in each timed method."""
    (out,) = outputs(runs, "profile_step")
    (line,) = [line for line in out.splitlines() if line.startswith("step ")]
    assert re.match(rf"step 1: peak RSS {NUMBER} GB; seconds ", line), line
    seconds = dict(part.rsplit(" ", 1) for part in line.split("; seconds ")[1].split(", "))
    assert {"run", "generation_round", "training_batch", "_critic_values", "loss", "backward",
            "training_step"} <= set(seconds), line


def test_learning_native_model(runs):
    """A folder that already holds a model is kept (no GGUF conversion, no download)."""
    (out,) = outputs(runs, "learning_native_model")
    folder = argument(runs, "learning_native_model", "--out")
    assert out == f"SmolLM2-135M-Instruct with tool templates in {folder}\n"


def test_learning_native_run(runs):
    """The transfer task (``make_transfer_task.py``); the stages through TRL's interface (``environment_factory``),
    scored on both tasks: a report, the held-out conversations and a line each, the table; ``report.py``'s
    collected results, their table, plot and curves."""
    made, out, collected, table, plotted, drawn = outputs(runs, "learning_native_run")
    assert drawn.strip().endswith("curves.png")
    assert made.startswith("wrote ") and "test.jsonl" in made
    folder = Path(runs["learning_native_run"].result()[1].args[runs["learning_native_run"].result()[1].args.index(
        "--out") + 1])
    for stage in NATIVE_STAGES:
        report = json.loads((folder / stage / "report.json").read_text())
        assert report["interface"] == "environment" and 0 <= report["final_em"] <= 1, stage
        assert 0 <= report["transfer_em"] <= 1 and report["commit"] and report["machine"]["cores"], stage
        assert len(collected.splitlines()) == len(NATIVE_STAGES)
        assert f"| {folder.name} |" in table and plotted.strip().endswith("em.png")
        assert len((folder / stage / "heldout.jsonl").read_text().splitlines()) == 2, stage
        assert re.search(rf"^== {stage}: EM {NUMBER}  searches {NUMBER}  turns {NUMBER}  malformed {NUMBER}  "
                         rf"\({NUMBER} min\)$", out, re.M), stage
    assert "| after SFT + AgenticGRPOTrainer (1 steps x 2 trajectories) |" in out


def test_learning_native_speed(runs):
    """Evaluation with the KV cache kept and without, alternating, each in its own process: the same EM, fewer tokens prefilled with it, the
    machine's ideal beside each; one GRPO step per variant, each in its own process, with its peak memory; a decode
    step with transformers' cache and with the preallocated one, beside its matrix products and its floor; the
    memory of a loss micro-batch at two sizes and the line through them."""
    _, evaluation, step, decode, memory = outputs(runs, "learning_native_speed")
    lines = [line for line in evaluation.splitlines() if line.startswith("eval ")]
    assert [line.split(":")[0] for line in lines] == ["eval cached", "eval reprefill", "eval reprefill",
                                                      "eval cached"]
    folder = Path(argument(runs, "learning_native_speed", "-c").split("'")[3]).parents[1]
    results = json.loads((folder / "speed_eval.json").read_text())["results"]
    cached, plain = results[0], results[1]
    assert cached["em"] == plain["em"] and cached["decode_steps"] == plain["decode_steps"]
    assert cached["prefilled_tokens"] - cached["shared_tokens"] + cached["reused_tokens"] == plain["prefilled_tokens"]
    # the tiny random model may never call a tool; the rows share the instructions' ids at the first turn
    assert cached["shared_tokens"] > 0 and cached["reused_tokens"] > 0
    steps = [line for line in step.splitlines() if line.startswith("step ")]
    assert [line.split(":")[0] for line in steps] == ["step reprefill", "step grouped"]
    assert all(re.search(rf"the loss computed \d+ .* peak RSS {NUMBER} GB", line) for line in steps)
    for rows in (1, 2):
        assert re.search(rf"^micro-batch {rows} x 16 tokens: peak RSS {NUMBER} GB \(before the loss {NUMBER} GB\)",
                         memory, re.M)
    assert re.search(r"^peak = .* GB x rows: the largest micro-batch of 16 tokens under 24 GB is -?\d+", memory, re.M)
    assert re.search(rf"^decode step, DynamicCache: {NUMBER} ms of CPU at batch 2, 8 positions$", decode, re.M)
    assert re.search(rf"^decode step, preallocated: {NUMBER} ms of CPU", decode, re.M)
    assert re.search(rf"^its matrix products alone: {NUMBER} ms; floor \(weights read once at {NUMBER} GB/s\)",
                     decode, re.M)


def test_long_horizon_speed(runs):
    """The walk's speed comparison from the committed run's reports: its table and the ratio they give."""
    _, out = outputs(runs, "long_horizon_speed")
    assert "| TRL GRPOTrainer | 2 | 8.66 | 666.8 | 658.6 | 448.4 | 86.1 | 132.3 |" in out
    assert "| AgenticGRPOTrainer | 2 | 8.66 | 290.6 | 288.3 | 77.8 | 82.8 | 130.1 |" in out
    assert "ours / TRL's seconds per step: 0.44 (CPU seconds: 0.44)" in out


def test_long_horizon_failures(runs):
    """failures.py sorts a run folder's held-out walks: two shortest walks, both arrived, no wrong step."""
    _, out = outputs(runs, "long_horizon_failures")
    assert "| walk_run/sft | 2 | 2 | 0 | 0 | 0 |  |" in out


def test_cpu_bf16(runs):
    """One forward and backward in float32 and under bfloat16 autocast, each timed; whether the CPU has bfloat16 in
    hardware, said first."""
    (out,) = outputs(runs, "cpu_bf16")
    assert re.search(r"; bfloat16 in hardware: (True|False)$", out, re.M), out
    assert re.search(rf"^ +float32: {NUMBER} s$", out, re.M) and re.search(rf"^bfloat16 autocast: {NUMBER} s$", out, re.M)


def test_call_graph(runs):
    """One line with the step's caller -> callee pairs and files; the pairs in ``--json`` include the reader's path
    from TRL's call to the rollout source (docs/design.md, "One training step"); GRPO's synchronous step stays under
    issue 53's bound."""
    out, _ = outputs(runs, "call_graph")
    match = re.search(r"^ppo, max_staleness 0: one step goes through (\d+) caller -> callee pairs of the library's "
                      r"functions, over (\d+) files$", out, re.M)
    assert match, out
    path = Path(runs["call_graph"].result()[0].args[-1])
    pairs = {tuple(p) for p in json.loads(path.read_text())["pairs"]}
    assert len(pairs) == int(match.group(1)) and len(json.loads(path.read_text())["files"]) == int(match.group(2))
    assert {("compat.py:GRPOTrainerBoundary._generate_and_score_completions",
             "trainers/ppo.py:AgenticPPOTrainer.training_batch"),
            ("trainers/ppo.py:AgenticPPOTrainer.training_batch", "trainers/base.py:AgenticTrainer.generation_round"),
            ("trainers/base.py:AgenticTrainer.rollout", "rollout/pipeline.py:SyncSource.rollouts")} <= pairs

    # issue 53: a synchronous GRPO step of fewer pairs than the 153 of its review (this script counted 155 at that
    # commit, 5bbc4f7); a helper added to the step's path shows here first (docs/design.md, "One training step")
    grpo = json.loads(Path(runs["call_graph"].result()[1].args[-1]).read_text())
    assert len(grpo["pairs"]) < 153, f"{len(grpo['pairs'])} pairs over {len(grpo['files'])} files"


def test_async_rollouts(runs):
    """One JSON line per load and generator with both step times and the speed-up, the table, and the same rows in
    ``--json``."""
    probe, *lines = json_lines(outputs(runs, "async_rollouts")[0])
    assert probe["split_efficiency"] > 0
    assert [(row["load"], row["generator"], row["max_staleness"]) for row in lines] == [
        (4, generator, staleness) for generator in ("thread", "process") for staleness in (1, 2)]
    for row in lines:
        assert row["sync_step_s"] > 0 and row["async_step_s"] > 0 and 0 < row["rollout_share"] <= 1
        assert row["speedup"] == pytest.approx(row["sync_step_s"] / row["async_step_s"], rel=0.01)
        assert row["repeats"] == 1 and row["speedups"] == [row["speedup"]]
    assert written(runs, "async_rollouts")["loads"] == lines
    assert written(runs, "async_rollouts")["split_efficiency"] == probe["split_efficiency"]


def test_every_benchmark_script_is_run_here(tmp_path):
    """A script added under benchmarks/ gets a smoke command here or in the vLLM suite
    (``tests/vllm_engine/test_vllm_benchmarks.py``), or it could break unseen (``task.py`` is a module of
    ``learning_native/run.py``, not a command)."""
    named = {argv[0] for argvs in commands(tmp_path, tmp_path, tmp_path, tmp_path).values() for argv in argvs}
    vllm_suite = (ROOT / "tests" / "vllm_engine" / "test_vllm_benchmarks.py").read_text()
    scripts = {str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks").rglob("*.py")
               if p.name != "__init__.py" and "__main__" in p.read_text()}
    assert {script for script in scripts - named if script not in vllm_suite} == set()


# -- benchmarks/rewards, benchmarks/tools ------------------------------------------------------------------------


def test_bench_code_tests(runs):
    (out,) = outputs(runs, "bench_code_tests")
    assert re.search(r"^backend=\w+ n=2 workers=1 pool=1$", out, re.M), out
    assert re.search(rf"^completions/s per run: {NUMBER} \(best {NUMBER}, {NUMBER} ms per completion\)$", out, re.M)


def test_bench_math_verify(runs):
    (out,) = outputs(runs, "bench_math_verify")
    for label in ("in this process (before):", "verifier process (math_equal):"):
        assert re.search(rf"^{re.escape(label)} +median {NUMBER} ms, p95 {NUMBER} ms \(n=8\)$", out, re.M), label
    assert re.search(rf"^fresh verifier after a kill: +{NUMBER} s \(median of 3\)$", out, re.M), out


def test_bench_retrieval(runs):
    """Index build, save and load, queries in process and over HTTP (the server in its own process)."""
    (out,) = outputs(runs, "bench_retrieval")
    report = json.loads(out)
    assert report["passages"] == 200 and report["bm25_index_build_s"] >= 0
    for mode in ("in_process_single", "in_process_batched", "http_single", "http_batched"):
        assert report[mode]["queries_per_s"] > 0, mode


def test_bench_sandbox(runs):
    """Each mode of the backend this machine has (bubblewrap, or the subprocess fallback)."""
    (out,) = outputs(runs, "bench_sandbox")
    ((backend, modes),) = json.loads(out)["results"].items()
    assert backend in ("bwrap", "subprocess")
    assert all(modes[mode]["n"] == 2 and modes[mode]["median_ms"] > 0 for mode in ("cold", "pooled", "warm"))
    assert all(modes[mode]["executions_per_s"] > 0 for mode in ("throughput_warm", "throughput_cold"))
