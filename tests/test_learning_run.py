"""benchmarks/learning/run.py without a model: demonstrations and few-shot prompts for one- and two-hop rows, the
curves the RL stages write and their plot."""

import importlib.util
import json
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "learning"
pytest.importorskip("bm25s")


def _load(name):
    spec = importlib.util.spec_from_file_location(f"learning_{name}", BENCHMARK / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("twohop")
    _load("make_task").make_task(out, people=60, test_people=20, train_questions=40, test_questions=8, seed=1, hops=2)
    return out


def _task(run, data, *extra):
    return run.Task(run.make_parser().parse_args(["--data", str(data), *extra]))


def _save_sft_adapter(tiny_model_dir, out):
    """A random LoRA on the tiny model saved where the RL and RFT stages read the SFT adapter."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    sft = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                         LoraConfig(r=2, target_modules="all-linear", task_type="CAUSAL_LM"))
    sft.save_pretrained(out / "sft" / "adapter")


def _rows(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_two_hop_demonstrations_search_twice_and_one_hop_ones_once(data):
    run = _load("run")
    train = _rows(data / "train.jsonl")
    demos = _task(run, data).demonstrations(6)
    assert len(demos) == 6  # every second search finds its answer (tests/test_learning_task.py)
    for demo, row in zip(demos, train):
        first, second = row["queries"]
        assert demo["completion"] == (f"<search> {first} </search><search> {second} </search>"
                                      f"<answer> {row['golden_answers'][0]} </answer>")
        assert demo["prompt"] == run.INSTRUCTION + f"Question: {row['question']}\n"
    onehop = _rows(data / "train_onehop.jsonl")
    demos = _task(run, data, "--sft-train", str(data / "train_onehop.jsonl")).demonstrations(4)
    assert [d["completion"] for d in demos] == [
        f"<search> {r['question']} </search><answer> {r['golden_answers'][0]} </answer>" for r in onehop[:4]]


def test_rows_without_queries_search_the_question_and_skip_unanswered(data, tmp_path):
    """Search-R1 files carry no ``queries``: a demonstration searches the question, and is dropped when that search
    does not return the answer (a two-hop question asked in one search, here)."""
    run = _load("run")
    train = [{"question": r["question"], "golden_answers": r["golden_answers"]} for r in _rows(data / "train.jsonl")]
    path = tmp_path / "plain.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in train))
    task = _task(run, data, "--sft-train", str(path))
    demos = task.demonstrations(len(train))
    kept = [r for r in train if any(g.lower() in task.search.invoke(r["question"]).observation.lower()
                                    for g in r["golden_answers"])]
    assert len(demos) == len(kept) < len(train) // 4
    assert all(d["completion"].count("<search>") == 1 for d in demos)


def test_fewshot_prompt_shows_both_searches_with_their_real_observations(data):
    run = _load("run")
    task = _task(run, data)
    prompt = task.fewshot_prompt({"question": "Who was the teacher of the teacher of Nobody?"})
    for shot in task.train[-2:]:
        for query in shot["queries"]:
            observation = task.search.invoke(query).observation
            assert f"<search> {query} </search>\n\n<information>{observation}</information>" in prompt
        assert f"<answer> {shot['golden_answers'][0]} </answer>" in prompt
    assert prompt.endswith("Question: Who was the teacher of the teacher of Nobody?\n")


def test_curves_come_from_the_step_logs_and_are_plotted(tmp_path):
    run = _load("run")
    logs = [{"loss": 0.1, "reward": 0.25, "agentic/tool_calls/search_per_trajectory": 1.0, "agentic/turns_mean": 2.0,
             "step": 1},
            {"loss": 0.2, "reward": 0.5, "agentic/turns_mean": 1.5, "async/staleness": 1.0, "step": 2},  # no search
            {"train_runtime": 3.0, "step": 2}]
    curves = run.step_curves(logs)
    assert curves == {"step": [1, 2], "reward": [0.25, 0.5], "searches": [1.0, 0.0], "turns": [2.0, 1.5],
                      "staleness": [0.0, 1.0]}
    (tmp_path / "grpo").mkdir()
    (tmp_path / "grpo" / "report.json").write_text(json.dumps({"curves": {**curves, "eval": [[0, 0.1, 1, 2]]}}))
    run.plot_curves([tmp_path], tmp_path / "plot" / "curves.png")
    assert (tmp_path / "plot" / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_documented_run_commands_parse():
    import re
    import shlex

    run = _load("run")
    docs = (BENCHMARK.parents[1] / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    commands = []
    for text in (run.__doc__, docs):
        for line in text.replace("\\\n", " ").splitlines():
            match = re.search(r"python benchmarks/learning/run\.py(.*)", line)
            if match:
                commands.append(shlex.split(match.group(1).split("`")[0].split("#")[0]))
    assert len(commands) >= 6
    for argv in commands:
        args = run.make_parser().parse_args(argv)
        assert {s.strip() for s in args.stages.split(",")} <= set(run.STAGES), argv


def test_seed_summary_gives_mean_and_spread_over_runs(tmp_path, capsys):
    run = _load("run")
    for seed, (em, searches) in enumerate([(0.89, 2.0), (0.75, 2.0), (0.5, 1.5)]):
        (tmp_path / f"s{seed}" / "grpo").mkdir(parents=True)
        report = {"em": em, "mean_searches": searches, "mean_turns": searches + 1, "steps": 12,
                  "trajectories_per_step": 16, "seconds": 60.0}
        (tmp_path / f"s{seed}" / "grpo" / "report.json").write_text(json.dumps(report))
    for seed in range(3):  # curves of each run, drawn together
        report = json.loads((tmp_path / f"s{seed}" / "grpo" / "report.json").read_text())
        report["curves"] = {"step": [1, 2], "reward": [0.25, 0.5], "searches": [2.0, 2.0], "turns": [3.0, 3.0],
                            "eval": [[0, 0.4, 2, 3], [2, 0.5, 2, 3]]}
        (tmp_path / f"s{seed}" / "grpo" / "report.json").write_text(json.dumps(report))
    plot = tmp_path / "seeds.png"
    assert run.main(["--summary", *(str(tmp_path / f"s{s}") for s in range(3)), "--plot", str(plot)]) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    row = capsys.readouterr().out.splitlines()[-1]
    # mean 0.7133, sample sd 0.1975; searches 1.8333 +- 0.2887
    assert row == ("| after SFT + GRPO (12 steps x 16 trajectories) | 3 | 0.71 +- 0.20 | 0.89, 0.75, 0.50 | "
                   "1.83 +- 0.29 | 2.83 +- 0.29 |")
    assert run.main(["--summary", "--out", str(tmp_path / "s2")]) == 0  # one run: its own table
    assert "| after SFT + GRPO (12 steps x 16 trajectories) | 0.50 | 1.50 | 2.50 | 1.0 |" in capsys.readouterr().out


def test_seed_summary_names_what_differs_between_runs(tmp_path, capsys):
    run = _load("run")
    for seed, kept in enumerate([32, 30, 32]):
        (tmp_path / f"s{seed}" / "rft").mkdir(parents=True)
        report = {"em": 0.9, "mean_searches": 2.0, "mean_turns": 3.0, "samples": 192, "kept": kept, "seconds": 60.0}
        (tmp_path / f"s{seed}" / "rft" / "report.json").write_text(json.dumps(report))
    assert run.main(["--summary", *(str(tmp_path / f"s{s}") for s in range(3))]) == 0
    assert "| after SFT + RFT (192 samples, 32/30/32 kept) | 3 | 0.90 +- 0.00 |" in capsys.readouterr().out


@pytest.mark.parametrize("keep_all", [False, True])
def test_rft_stage_runs_end_to_end_on_a_local_model(data, tmp_path, tiny_model_dir, monkeypatch, keep_all):
    """The ``rft`` stage through ``main`` on a tiny local model and a saved SFT adapter: the random model answers
    nothing right, so rft keeps nothing and evaluates the SFT model; with a success threshold of 0 every sample
    passes, one is kept per question and rft trains its own adapter. It samples the questions of GRPO's batches: 2
    steps of 2 passes are one batch of 2 questions x 2 samples."""
    import functools

    import trl_agentic.sft

    if keep_all:
        monkeypatch.setattr(trl_agentic.sft, "rejection_sampling",
                            functools.partial(trl_agentic.sft.rejection_sampling, success_threshold=0.0))
    run, out = _load("run"), tmp_path / "run"
    _save_sft_adapter(tiny_model_dir, out)
    assert run.main(["--data", str(data), "--out", str(out), "--model", tiny_model_dir, "--stages", "rft",
                     "--test-size", "2", "--eval-batch-size", "4", "--sft-epochs", "1", "--rl-steps", "2",
                     "--num-iterations", "2", "--rl-prompts-per-step", "2", "--num-generations", "2", "--max-tokens-per-turn", "8",
                     "--max-completion-length", "64", "--lora-r", "2"]) == 0
    report = json.loads((out / "rft" / "report.json").read_text())
    assert report["samples"] == 4 and len(report["examples"]) == 2
    assert report["kept"] == (2 if keep_all else 0)  # at most one kept trajectory per question
    assert (out / "rft" / "adapter" / "adapter_config.json").exists() is keep_all
    assert (report["train_loss"] is not None) is keep_all


def test_grad_accum_that_does_not_divide_the_step_fails_before_loading_anything(data, tmp_path):
    run = _load("run")
    with pytest.raises(SystemExit, match="--grad-accum 3 must divide the 16 trajectories per step"):
        run.main(["--data", str(data), "--out", str(tmp_path), "--stages", "grpo", "--grad-accum", "3"])
    assert not any(tmp_path.iterdir())


def _run_tiny_rl_stage(run, data, out, tiny_model_dir, stage, *extra):
    """``run.main`` with one RL stage on the tiny model from a random saved SFT adapter: 2 questions x 2 samples per
    step, 2 test questions; ``extra`` adds or overrides flags. Returns the stage's report."""
    _save_sft_adapter(tiny_model_dir, out)
    assert run.main(["--data", str(data), "--out", str(out), "--model", tiny_model_dir, "--stages", stage,
                     "--test-size", "2", "--eval-batch-size", "4", "--rl-prompts-per-step", "2",
                     "--num-generations", "2", "--max-tokens-per-turn", "8", "--max-completion-length", "64",
                     "--lora-r", "2", *extra]) == 0
    return json.loads((out / stage / "report.json").read_text())


@pytest.mark.parametrize("stage", ["grpo", "ppo"])
def test_rl_stage_runs_in_micro_batches_of_one(data, tmp_path, tiny_model_dir, stage):
    """An RL stage through ``main`` with ``--grad-accum`` = trajectories per step: one optimizer step on micro-batches
    of one trajectory, its curves and report written (the memory knob of the PPO run in docs/benchmarks.md)."""
    run, out = _load("run"), tmp_path / "run"
    report = _run_tiny_rl_stage(run, data, out, tiny_model_dir, stage, "--rl-steps", "1", "--grad-accum", "4",
                                "--lam", "1.0")
    assert report["trajectories_per_step"] == 4 and report["micro_batch"] == 1
    assert report.get("lam") == (1.0 if stage == "ppo" else None)  # GAE lambda: PPO stages only
    assert len(report["train_reward"]) == 1
    assert (out / stage / "adapter" / "adapter_config.json").exists()


@pytest.mark.parametrize("correction", ["decoupled", "none"])
def test_grpo_one_round_behind_trains_stale_samples_with_the_correction_asked(data, tmp_path, tiny_model_dir,
                                                                              correction):
    """``--max-staleness 1 --async-correction C``: the grpo stage's rollouts run one round ahead (staleness 0 at the
    first step, 1 after), with the correction the report and its summary row name."""
    run = _load("run")
    report = _run_tiny_rl_stage(run, data, tmp_path / "run", tiny_model_dir, "grpo", "--rl-steps", "3",
                                "--eval-every", "0", "--max-staleness", "1", "--async-correction", correction,
                                "--async-generator", "thread")
    assert (report["max_staleness"], report["async_correction"]) == (1, correction)
    assert report["curves"]["staleness"] == [0.0, 1.0, 1.0]
    assert len(report["train_reward"]) == 3
    assert f"GRPO (3 steps x 4 trajectories, max_staleness 1, {correction} correction) |" in run.summary(tmp_path / "run")


def test_num_iterations_that_does_not_divide_the_steps_fails_before_loading_anything(data, tmp_path):
    run = _load("run")
    with pytest.raises(SystemExit, match="--num-iterations 2 must divide --rl-steps 3"):
        run.main(["--data", str(data), "--out", str(tmp_path), "--stages", "grpo", "--rl-steps", "3",
                  "--num-iterations", "2"])
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("stage", ["grpo", "ppo"])
def test_two_passes_sample_one_batch_for_two_steps(data, tmp_path, tiny_model_dir, stage):
    """``--rl-steps 2 --num-iterations 2``: one batch of 4 trajectories sampled (one reward logged), two optimizer
    steps on it; the row name says the passes and the samples (what ``rft`` then draws)."""
    run, out = _load("run"), tmp_path / "run"
    report = _run_tiny_rl_stage(run, data, out, tiny_model_dir, stage, "--rl-steps", "2", "--num-iterations", "2",
                                "--eval-every", "0")
    assert (report["steps"], report["num_iterations"], report["samples"]) == (2, 2, 4)
    assert len(report["train_reward"]) == 1
    assert "(2 steps x 4 trajectories, 2 passes: 4 samples)" in run.summary(out)
