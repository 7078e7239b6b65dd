"""The recipes (recipes/gsm8k_tools.py, recipes/search_r1.py), their accelerate configs and the Colab notebooks.

Everything runs offline on CPU with the toy tokenizer and a tiny random Qwen2 (the ``tiny_model_dir`` fixture of
tests/conftest.py) and the fixtures in tests/recipes/fixtures/.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SHARED = REPO.parent / "shared"
NOTEBOOKS = {"gsm8k_tools": REPO / "notebooks" / "gsm8k_tools.ipynb", "search_r1": REPO / "notebooks" / "search_r1.ipynb"}
ACCELERATE_CONFIGS = ["deepspeed_zero2", "deepspeed_zero3", "fsdp", "multi_gpu"]


def _load_recipe(name: str):
    """Import recipes/<name>.py the way ``python recipes/<name>.py`` sees it (its folder on sys.path)."""
    if str(RECIPES) not in sys.path:
        sys.path.insert(0, str(RECIPES))
    module_name = f"recipe_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, RECIPES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gsm8k():
    return _load_recipe("gsm8k_tools")


@pytest.fixture(scope="module")
def search_r1():
    return _load_recipe("search_r1")


@pytest.fixture(scope="module")
def common():
    _load_recipe("gsm8k_tools")
    import _common

    return _common


def _tiny_run_args(model_dir: str, tmp_path: Path) -> list[str]:
    return [
        "--model", model_dir, "--output-dir", str(tmp_path / "out"), "--use-cpu", "--precision", "fp32",
        "--max-steps", "1", "--num-generations", "2", "--per-device-train-batch-size", "4",
        "--max-completion-length", "48", "--max-tokens-per-turn", "16", "--max-turns", "2",
        "--max-observation-tokens", "32", "--report-to", "none", "--save-steps", "1000",
        "--no-gradient-checkpointing",
    ]


def _train_logs(trainer) -> list[dict]:
    trainer.train()
    return [row for row in trainer.state.log_history if "reward" in row]


# ----------------------------------------------------------------------------------------------------------------
# One training step per recipe
# ----------------------------------------------------------------------------------------------------------------


def test_gsm8k_python_tool_one_step(gsm8k, tiny_model_dir, tmp_path):
    args = gsm8k.parse_args(
        _tiny_run_args(tiny_model_dir, tmp_path)
        + ["--dataset-path", str(FIXTURES / "gsm8k_small.jsonl"), "--sandbox-pool-size", "0", "--length-penalty",
           "--trajectory-dir", str(tmp_path / "traj")]
    )
    trainer = gsm8k.build_trainer(args)
    assert type(trainer).__name__ == "AgenticGRPOTrainer"
    assert trainer.args.rollout_mode == "text" and trainer.args.beta == 0.0
    (row,) = _train_logs(trainer)
    for key in ["reward", "reward_std", "rewards/gsm8k_reward/mean", "reward/correct", "reward/format",
                "reward/tool_use", "reward/length", "reward/total"]:
        assert key in row, key
    assert row["agentic/mask_audit"] == 0
    assert (tmp_path / "traj" / "trajectories-rank0.jsonl").exists()


def test_gsm8k_calculator_chat_mode_one_step(gsm8k, tiny_model_dir, tmp_path):
    args = gsm8k.parse_args(
        _tiny_run_args(tiny_model_dir, tmp_path)
        + ["--dataset-path", str(FIXTURES / "gsm8k_small.jsonl"), "--tool", "calculator", "--rollout-mode", "chat",
           "--use-lora", "--beta", "0.01", "--kl-estimator", "k1"]
    )
    assert args.learning_rate == gsm8k.DEFAULTS["lr_lora"]
    trainer = gsm8k.build_trainer(args)
    assert trainer.args.rollout_mode == "chat" and trainer.args.kl_estimator == "k1"
    assert type(trainer.model).__name__.startswith("Peft")
    (row,) = _train_logs(trainer)
    assert {"reward/correct", "reward/format", "reward/tool_use", "kl"} <= set(row)
    assert row["agentic/mask_audit"] == 0


def test_search_r1_bm25_one_step(search_r1, tiny_model_dir, tmp_path):
    index_dir = tmp_path / "bm25"
    args = search_r1.parse_args(
        _tiny_run_args(tiny_model_dir, tmp_path)
        + ["--dataset-path", str(FIXTURES / "search_questions.jsonl"),
           "--corpus", str(FIXTURES / "search_corpus.jsonl"), "--index-dir", str(index_dir)]
    )
    trainer = search_r1.build_trainer(args)
    assert trainer.args.rollout_mode == "text" and trainer.args.beta == 0.001
    assert trainer.args.reward_weights == [1.0, 0.0]
    (row,) = _train_logs(trainer)
    for key in ["reward", "rewards/search_r1/mean", "rewards/qa_em/mean", "kl"]:
        assert key in row, key
    assert row["agentic/mask_audit"] == 0
    assert (index_dir / "trl_agentic_index.json").exists()  # built once, loaded by later runs


def test_ppo_one_step_when_available(common, search_r1, tiny_model_dir, tmp_path):
    if not common.ppo_available():
        pytest.skip("trl_agentic.trainers.ppo does not import here: the recipes offer --algo grpo only")
    args = search_r1.parse_args(
        _tiny_run_args(tiny_model_dir, tmp_path)
        + ["--dataset-path", str(FIXTURES / "search_questions.jsonl"), "--corpus",
           str(FIXTURES / "search_corpus.jsonl"), "--algo", "ppo", "--num-generations", "1", "--reward", "em"]
    )
    assert args.kl_estimator == "k1"
    trainer = search_r1.build_trainer(args)
    assert type(trainer).__name__ == "AgenticPPOTrainer"
    assert trainer.args.beta == 0.001 and trainer.args.num_generations == 1
    (row,) = _train_logs(trainer)
    assert "rewards/qa_em/mean" in row


# ----------------------------------------------------------------------------------------------------------------
# Clear errors on CPU
# ----------------------------------------------------------------------------------------------------------------


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.parametrize("name", ["gsm8k_tools", "search_r1"])
def test_load_in_4bit_refused_without_cuda(name, tmp_path):
    recipe = _load_recipe(name)
    extra = ["--dataset-path", "unused.jsonl"] + (["--retriever-url", "http://127.0.0.1:9/retrieve"] if name == "search_r1" else [])
    # --use-cpu: refused on any machine, before the tokenizer, data or model are touched (the paths do not exist).
    args = recipe.parse_args(["--model", "/nonexistent/model", "--load-in-4bit", "--use-cpu"] + extra)
    assert args.use_lora  # QLoRA implies LoRA
    with pytest.raises(recipe.RecipeError, match=r"--load-in-4bit.*needs a CUDA GPU"):
        recipe.build_trainer(args)
    if _cuda() and _has("bitsandbytes"):
        return
    args = recipe.parse_args(["--model", "/nonexistent/model", "--load-in-4bit"] + extra)
    with pytest.raises(recipe.RecipeError, match=r"CUDA GPU|bitsandbytes"):
        recipe.build_trainer(args)


@pytest.mark.parametrize("name", ["gsm8k_tools", "search_r1"])
def test_use_vllm_refused_without_vllm_or_cuda(name):
    if _cuda() and _has("vllm"):
        pytest.skip("vLLM and CUDA are both available here")
    recipe = _load_recipe(name)
    extra = ["--retriever-url", "http://127.0.0.1:9/retrieve"] if name == "search_r1" else []
    args = recipe.parse_args(["--model", "/nonexistent/model", "--use-vllm"] + extra)
    expected = r"pip install 'trl-agentic\[vllm\]'" if not _has("vllm") else r"--use-vllm needs a CUDA GPU"
    with pytest.raises(recipe.RecipeError, match=expected):
        recipe.build_trainer(args)


def test_script_prints_the_error_and_exits_2():
    """The command line itself: no traceback, the reason on stderr, exit status 2."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(RECIPES / "gsm8k_tools.py"), "--load-in-4bit", "--use-cpu", "--model", "/nonexistent"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "error: --load-in-4bit (QLoRA) needs a CUDA GPU" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_precision_and_lora_settings_on_cpu(gsm8k, common):
    args = gsm8k.parse_args(["--use-cpu", "--use-lora", "--lora-r", "8"])
    precision = common.precision_settings(args)
    assert precision["config"] == {"bf16": False, "fp16": False, "use_cpu": True}
    assert precision["dtype"] == "float32"  # fp32 master weights unless asked otherwise
    model = common.model_settings(args, precision)
    assert model["quantization_config"] is None and model["model_init_kwargs"] == {"dtype": "float32"}
    lora = model["peft_config"]
    assert lora.r == 8 and lora.target_modules == "all-linear" and lora.task_type == "CAUSAL_LM"
    with pytest.raises(common.RecipeError, match="needs a CUDA GPU"):
        common.precision_settings(gsm8k.parse_args(["--use-cpu", "--precision", "bf16"]))


def test_search_r1_needs_exactly_one_retriever(search_r1):
    with pytest.raises(search_r1.RecipeError, match="no retriever"):
        search_r1.parse_args([])
    with pytest.raises(search_r1.RecipeError, match="not both"):
        search_r1.parse_args(["--corpus", "c.jsonl", "--retriever-url", "http://127.0.0.1:8000/retrieve"])


def test_grpo_needs_a_group(gsm8k):
    with pytest.raises(gsm8k.RecipeError, match="num-generations >= 2"):
        gsm8k.parse_args(["--num-generations", "1"])


# ----------------------------------------------------------------------------------------------------------------
# Prompts, environments and rewards of the recipes, end to end through the rollout engine
# ----------------------------------------------------------------------------------------------------------------


def test_search_r1_prompt_is_search_r1s(search_r1):
    prompt = search_r1.make_prompt("  who wrote the salt ledger ", chat=True)
    assert prompt == [{"role": "user", "content": search_r1.SEARCH_R1_TEMPLATE.format(question="who wrote the salt ledger?")}]
    text = search_r1.make_prompt("Who?", chat=False)
    assert text.startswith("Answer the given question. You must conduct reasoning inside <think> and </think> first")
    assert text.endswith("For example, <answer> Beijing </answer>. Question: Who?\n")


def _scripted_rollout(tokenizer, factory, turns: list[str], prompt: str, row: dict):
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
    completion = "".join(trajectory.actions)
    columns = {k: [v] for k, v in row.items() if k != "prompt"}
    logged = {}
    values = reward(prompts=["p"], completions=[completion], trajectory=[trajectory],
                    log_metric=lambda name, value: logged.__setitem__(name, value), **columns)
    return values[0], logged


def test_gsm8k_python_environment_and_reward(gsm8k, tokenizer):
    args = gsm8k.parse_args(["--sandbox-pool-size", "0"])
    factory, sandbox = gsm8k.build_environment(args)
    row = json.loads((FIXTURES / "gsm8k_small.jsonl").read_text().splitlines()[0])  # Janet's ducks: 18
    turns = ["Eggs left to sell: <code>\nleft = 16 - 3 - 4\nprint(left * 2)\n</code>", "So she makes <answer>18</answer>"]
    try:
        trajectory = _scripted_rollout(tokenizer, factory, turns, "question\n", row)
    finally:
        sandbox.close()
    assert trajectory.stop_reason == "terminated" and trajectory.num_turns == 2
    assert trajectory.observations[0] == "\n\n<interpreter>18\n</interpreter>\n\n"
    total, logged = _score(gsm8k.build_reward(args), trajectory, row)
    assert logged["reward/correct"] == 1.0 and logged["reward/format"] == 1.0 and logged["reward/tool_use"] == 0.5
    assert total == pytest.approx(1.0 + 0.2 * 1.0 + 0.1 * 0.5)


def test_gsm8k_calculator_environment(gsm8k, tokenizer):
    args = gsm8k.parse_args(["--tool", "calculator"])
    factory, _ = gsm8k.build_environment(args)
    row = {"question": "q", "answer": "#### 18"}
    turns = ["<calc>(16 - 3 - 4) * 2</calc>", "<answer>17</answer>"]
    trajectory = _scripted_rollout(tokenizer, factory, turns, "question\n", row)
    assert trajectory.observations[0] == "\n\n<result>18</result>\n\n"
    _, logged = _score(gsm8k.build_reward(args), trajectory, row)
    assert logged["reward/correct"] == 0.0 and logged["reward/format"] == 1.0


def test_gsm8k_format_reward_ignores_chat_template_text(gsm8k):
    """In chat mode the observation carries the template's tokens; the recipe's format reward scores only what the
    model wrote and the bare observation block (the plain FormatReward would penalise every tool call)."""
    from trl_agentic import Trajectory
    from trl_agentic.rewards import RETOOL_TAGS, FormatReward

    t = Trajectory(prompt_ids=[1], actions=["First <code>print(9)</code>", "So <answer>9</answer>"],
                   observations=[("<|im_end|>\n<|im_start|>tool\n\n\n<interpreter>9\n</interpreter>\n\n<|im_end|>\n"
                                  "<|im_start|>assistant\n"), None])
    kwargs = {"prompts": ["p"], "completions": ["x"], "trajectory": [t]}
    assert gsm8k.protocol_format_reward(RETOOL_TAGS)(**kwargs) == [1.0]
    assert FormatReward(RETOOL_TAGS)(**kwargs)[0] < 1.0
    cut = Trajectory(prompt_ids=[1], actions=t.actions, observations=["<interpreter>9 9 9 (cut by the budget", None])
    assert gsm8k.protocol_format_reward(RETOOL_TAGS)(prompts=["p"], completions=["x"], trajectory=[cut]) == [1.0]


def test_search_r1_environment_and_reward(search_r1, tokenizer):
    args = search_r1.parse_args(["--corpus", str(FIXTURES / "search_corpus.jsonl")])
    factory = search_r1.build_environment(args, search_r1.build_retriever(args))
    row = json.loads((FIXTURES / "search_questions.jsonl").read_text().splitlines()[0])  # capital of Veloria
    turns = ["<think>I need the capital.</think>\n<search> capital of Veloria </search>",
             "<think>It is Port Amberlin.</think>\n<answer> Port Amberlin </answer>"]
    trajectory = _scripted_rollout(tokenizer, factory, turns, search_r1.make_prompt(row["question"], False), row)
    observation = trajectory.observations[0]
    assert observation.startswith('\n\n<information>Doc 1(Title: "Veloria") Veloria is a small island nation')
    assert observation.count("Doc ") == 3 and observation.endswith("</information>\n\n")
    rewards, weights = search_r1.build_rewards(args)
    assert [r.__name__ for r in rewards] == ["search_r1", "qa_em"] and weights == [1.0, 0.0]
    assert [_score(r, trajectory, row)[0] for r in rewards] == [1.0, 1.0]
    invalid = _scripted_rollout(tokenizer, factory, ["I think it is Paris.", "<answer> Paris </answer>"],
                                search_r1.make_prompt(row["question"], False), row)
    assert invalid.observations[0] == search_r1.SEARCH_R1_INVALID_MESSAGE


def test_local_data_folder_from_shared(gsm8k, tokenizer):
    """--dataset-path accepts a folder with <split>.jsonl, as /work/shared/data/gsm8k."""
    folder = SHARED / "data" / "gsm8k"
    if not (folder / "test.jsonl").exists():
        pytest.skip(f"{folder} is missing (the shared data folder is expected beside the checkout)")
    args = gsm8k.parse_args(["--dataset-path", str(folder), "--dataset-split", "test", "--max-train-samples", "5"])
    data = gsm8k.build_dataset(args, tokenizer)
    assert len(data) == 5 and set(data.column_names) == {"prompt", "question", "answer"}
    assert data[0]["prompt"][0] == {"role": "system", "content": gsm8k.PYTHON_SYSTEM_PROMPT}
    assert data[0]["answer"].rstrip().split("#### ")[-1] == "18"


def test_local_search_data_without_chat_template(search_r1):
    class NoTemplate:
        chat_template = None

    args = search_r1.parse_args(["--dataset-path", str(FIXTURES / "search_questions.jsonl"),
                                 "--retriever-url", "http://127.0.0.1:8000/retrieve"])
    data = search_r1.build_dataset(args, NoTemplate())
    assert set(data.column_names) == {"prompt", "question", "golden_answers"}
    assert data[2]["prompt"].endswith("Question: On which mountain does the river Ismene rise?\n")
    assert data[1]["golden_answers"] == ["Odile Marcheval", "Marcheval"]


# ----------------------------------------------------------------------------------------------------------------
# Documented command lines parse
# ----------------------------------------------------------------------------------------------------------------


def _command_lines(text: str, script: str) -> list[list[str]]:
    """The arguments after ``recipes/<script>.py`` of every command line in ``text`` (continuations joined)."""
    text = text.replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        match = re.search(rf"recipes/{script}\.py(?=\s|$)(.*)", line)
        if match and ("python " in line or "accelerate launch" in line):
            args = match.group(1).split("#")[0]
            commands.append(shlex.split(args.replace("`", "")))
    return commands


@pytest.mark.parametrize("name", ["gsm8k_tools", "search_r1"])
def test_documented_commands_parse(name, common):
    recipe = _load_recipe(name)
    sources = [recipe.__doc__, (REPO / "docs" / "recipes.md").read_text(encoding="utf-8")]
    commands = [c for text in sources for c in _command_lines(text, name)]
    assert len(commands) >= 5
    for argv in commands:
        if "--help" in argv or ("ppo" in argv and not common.ppo_available()):
            continue
        recipe.parse_args(argv)  # SystemExit on an unknown option or a bad value, RecipeError on a bad combination


@pytest.mark.parametrize("name", ["gsm8k_tools", "search_r1"])
def test_help(name):
    assert "--use-lora" in _load_recipe(name).make_parser().format_help()


# ----------------------------------------------------------------------------------------------------------------
# Accelerate configs
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ACCELERATE_CONFIGS)
def test_accelerate_config_loads(name):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(RECIPES / "accelerate" / f"{name}.yaml"))
    expected = {"multi_gpu": "MULTI_GPU", "fsdp": "FSDP"}.get(name, "DEEPSPEED")
    assert str(config.distributed_type).endswith(expected) and config.mixed_precision == "bf16"
    if name.startswith("deepspeed"):
        assert config.deepspeed_config["zero_stage"] == int(name[-1])
    assert f"recipes/accelerate/{name}.yaml" in (REPO / "docs" / "recipes.md").read_text(encoding="utf-8")


# ----------------------------------------------------------------------------------------------------------------
# Notebooks
# ----------------------------------------------------------------------------------------------------------------


def _code_cells(path: Path) -> list[str]:
    notebook = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in notebook["cells"] if c["cell_type"] == "code"]


def _without_magics(source: str) -> str:
    return "\n".join("" if line.lstrip().startswith(("!", "%")) else line for line in source.splitlines())


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_is_valid_nbformat_4(name):
    path = NOTEBOOKS[name]
    notebook = json.loads(path.read_text(encoding="utf-8"))
    assert notebook["nbformat"] == 4
    assert notebook["metadata"]["accelerator"] == "GPU"
    try:
        import nbformat
    except ImportError:
        assert all({"cell_type", "source", "metadata"} <= set(c) for c in notebook["cells"])
        return
    nbformat.validate(nbformat.read(str(path), as_version=4))


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_code_compiles_and_installs(name):
    cells = _code_cells(NOTEBOOKS[name])
    assert len(cells) >= 8
    assert 'pip install -q "trl-agentic[math,retrieval,vllm]"' in cells[0]
    for i, source in enumerate(cells):
        compile(_without_magics(source), f"{name}.ipynb[cell {i}]", "exec")


PUBLIC_MODULES = {"trl_agentic", "trl_agentic.rewards", "trl_agentic.tools"}


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_imports_only_public_names_that_exist(name):
    used = set()
    for source in _code_cells(NOTEBOOKS[name]):
        for node in ast.walk(ast.parse(_without_magics(source))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trl_agentic"):
                assert node.module in PUBLIC_MODULES, node.module
                for alias in node.names:
                    assert not alias.name.startswith("_")
                    module = importlib.import_module(node.module)
                    assert hasattr(module, alias.name), f"{node.module}.{alias.name} does not exist"
                    used.add(alias.name)
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("trl_agentic.") and a.name not in PUBLIC_MODULES for a in node.names)
    assert {"AgenticGRPOTrainer", "AgenticGRPOConfig", "TagEnvironment", "run_rollouts", "render_html"} <= used
