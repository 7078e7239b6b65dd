"""python -m trl_agentic.evaluate: accuracy and pass@k on a local dataset, the JSON report and the trajectories,
LoRA adapters, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ScriptedGenerator

from trl_agentic import evaluate as evaluate_module
from trl_agentic.evaluate.cli import main

FIXTURES = Path(__file__).resolve().parent / "recipes" / "fixtures"
REPO = Path(__file__).resolve().parents[1]
GOLD = {"Janet": "18", "robe": "3", "Josh": "70000"}  # the first three rows of gsm8k_small.jsonl


@pytest.fixture
def scripted(monkeypatch, tokenizer):
    """Stand in for transformers generation: row 0 always right; row 1 right on every other sample (so 2 of 4);
    the others always wrong. Everything else (parsing, task, rows, scoring, files) is the real CLI path."""
    calls = {"n": 0}

    def script(ids):
        text = tokenizer.decode(ids)
        name = next((k for k in GOLD if k in text), None)
        calls["n"] += 1
        if "<result>2</result>" not in text:  # (the prompt itself mentions <result>)
            return "<calc>1 + 1</calc>"
        right = name == "Janet" or (name == "robe" and calls["n"] % 4 < 2)
        return f"<answer>{GOLD[name] if right else 0}</answer>"

    class Generator(ScriptedGenerator):
        def __init__(self, model, tok, *args, **kwargs):
            super().__init__(tok, script)

    monkeypatch.setattr(evaluate_module, "HFGenerator", Generator)


def test_accuracy_and_pass_at_k_on_a_local_dataset(scripted, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "eval"
    argv = ["--model", tiny_model_dir, "--task", "gsm8k_tools", "--tool", "calculator",
            "--dataset", str(FIXTURES / "gsm8k_small.jsonl"), "--max_rows", "3", "--samples", "4",
            "--k", "1", "2", "4", "--batch_size", "5", "--max_completion_length", "64", "--output_dir", str(out)]
    assert main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["num_rows"] == 3 and report["samples_per_row"] == 4
    assert report["successes"][0] == 4 and report["successes"][2] == 0
    c = report["successes"][1]
    assert 0 < c < 4
    assert report["accuracy"] == pytest.approx((4 + c) / 12)
    # pass@2 of row 1 with c of 4 samples right: 1 - C(4-c, 2) / C(4, 2)
    from math import comb

    assert report["pass_at_k"]["2"] == pytest.approx((1 + 1 - comb(4 - c, 2) / comb(4, 2)) / 3)
    assert report["pass_at_k"]["4"] == pytest.approx(2 / 3)
    assert report["mean_turns"] == 2 and report["mean_tool_calls"] == 1 and report["truncation_rate"] == 0
    assert report["task_arguments"]["tool"] == "calculator"
    # the trajectories agree with the report and load with datasets
    from datasets import load_dataset

    rows = load_dataset("json", data_files=str(out / "trajectories.jsonl"), split="train")
    assert len(rows) == 12 and sum(rows["success"]) == 4 + c
    assert [sum(r["success"] for r in rows if r["row"] == i) for i in range(3)] == report["successes"]
    page = (out / "trajectories.html").read_text()
    assert "Trajectory 0" in page and "<th>reward (reward functions)</th>" in page  # the list's reward column
    assert page.count("<td>1</td><td>2</td>") == 4 + c  # the successes: reward 1, two turns
    summary = capsys.readouterr().out.splitlines()[0]
    assert summary.startswith(f"accuracy {(4 + c) / 12:.3f}  pass@1 {(4 + c) / 12:.3f}  pass@2 "), summary
    print(summary)  # docs/recipes.md quotes it


def test_an_agent_from_a_dotted_path(monkeypatch, tiny_model_dir, tmp_path, capsys):
    """--agent module.name: the agent asks the model through the endpoint, on the task's rows, scored by the task's
    success check (here the scripted model answers Janet's question right and the other wrong), pass@1 and pass@2
    printed, the HTML list with each trajectory's reward."""
    (tmp_path / "eval_agents.py").write_text(
        "async def agent(client, question, **row):\n"
        "    reply = await client.chat.completions.create(model='policy', messages=[{'role': 'user', 'content': question}])\n"
        "    return reply.choices[0].message.content\n\n\n"
        "async def swapped(question, client):\n    return ''\n")
    prompts = []

    def script(ids):
        text = tokenizer.decode(ids)
        prompts.append(text)
        return ("<answer>18</answer>" if "Janet" in text else "<answer>0</answer>") + "<|im_end|>"

    class Generator(ScriptedGenerator):
        def __init__(self, model, tok, *args, **kwargs):
            super().__init__(tok, script)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    monkeypatch.setattr(evaluate_module, "HFGenerator", Generator)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # --agent puts the current directory on it
    out = tmp_path / "eval"
    common = ["--model", tiny_model_dir, "--task", "gsm8k_tools", "--tool", "calculator", "--dataset",
              str(FIXTURES / "gsm8k_small.jsonl"), "--max_rows", "2", "--output_dir", str(out)]
    assert main([*common, "--agent", "eval_agents.agent", "--samples", "2", "--k", "1", "2"]) == 0
    assert capsys.readouterr().out.startswith("accuracy 0.500  pass@1 0.500  pass@2 0.500  reward 0.500")
    # the agent's own messages, not the task's prompt (whose system prompt explains <calc>)
    assert len(prompts) == 4 and all("<calc>" not in p and ("Janet" in p or "robe" in p) for p in prompts)
    report = json.loads((out / "report.json").read_text())
    assert report["successes"] == [2, 0] and report["arguments"]["agent"] == "eval_agents.agent"
    rows = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert [r["requests"] for r in rows] == [1] * 4 and [r["reward"] for r in rows] == [1.0, 1.0, 0.0, 0.0]
    page = (out / "trajectories.html").read_text()
    assert "<th>reward (reward functions)</th>" in page  # each trajectory's reward and turns in the list:
    assert page.count("<td>1</td><td>1</td>") == 2 and page.count("<td>0</td><td>1</td>") == 2

    assert main([*common, "--agent", "eval_agents.swapped"]) == 2
    assert capsys.readouterr().err.startswith("error: --agent eval_agents.swapped: the agent's client comes first")
    assert main([*common, "--agent", "eval_agents.nothing"]) == 2
    assert "module eval_agents has no 'nothing'" in capsys.readouterr().err


def test_lora_adapter(tiny_model_dir, tmp_path, capsys):
    """--model may be an adapter folder (its base is read from adapter_config.json); --adapter applies one."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    adapter = tmp_path / "adapter"
    get_peft_model(base, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM")).save_pretrained(adapter)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(adapter)
    common = ["--task", "gsm8k_tools", "--tool", "calculator", "--dataset", str(FIXTURES / "gsm8k_small.jsonl"),
              "--max_rows", "2", "--greedy", "--max_tokens_per_turn", "8", "--max_completion_length", "24"]
    assert main(["--model", str(adapter), "--output_dir", str(tmp_path / "a"), *common]) == 0
    applied = ["--model", tiny_model_dir, "--adapter", str(adapter), "--output_dir", str(tmp_path / "b")]
    assert main([*applied, *common]) == 0
    first = (tmp_path / "a" / "trajectories.jsonl").read_text()
    assert first and first == (tmp_path / "b" / "trajectories.jsonl").read_text()  # greedy: the same rollouts


@pytest.mark.parametrize("argv,message", [
    (["--model", "/nowhere/model"], "pass --model with a local model directory"),
    (["--dataset", "/nowhere/data.jsonl"], "--dataset /nowhere/data.jsonl does not exist"),
    (["--samples", "2", "--k", "4"], "--k [4]: each k must be between 1 and --samples 2"),
    (["--task", "chess"], "--task 'chess' is unknown"),
    (["--task", "search_r1"], "no retriever: pass --corpus"),
    (["--tool", "calculator_native", "--rollout_mode", "text"], "native tool calls need rollout_mode='chat'"),
    (["--tool", "calculator_native"], "native tool calls need a response template"),  # chat inferred, as in training
    # the tiny model's ChatML template has no tool calls TRL can parse: at start-up, not at the first rollout
    (["--tool", "calculator_native", "--rollout_mode", "chat"],
     "native tool calls need a response template to parse the model's calls, and TRL knows none"),
    (["--model", "outputs/gsm8k-tools-grpo/checkpoint-100"], "checkpoint-100: no such directory"),
])
def test_errors_are_one_line(argv, message, tiny_model_dir):
    base = ["--model", tiny_model_dir, "--dataset", str(FIXTURES / "gsm8k_small.jsonl"), "--tool", "calculator"]
    if argv[0] == "--task" and argv[1] == "search_r1":
        base = base[:4]
    env = {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "trl_agentic.evaluate", *base, *argv], capture_output=True,
                          text=True, timeout=120, env=env)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(lines) == 1 and message in lines[0], proc.stderr[-2000:]


def test_no_network_fails_at_once_and_says_what_to_do(tmp_path):
    """A hub id, and a path shaped like one (``outputs/gsm8k-tools-grpo``, the README's example before training),
    with a hub that cannot be reached and HF_HUB_OFFLINE unset: one line within seconds (huggingface_hub alone retries
    for about a minute), saying that there is no such directory and naming HF_HUB_OFFLINE=1."""
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HF_ENDPOINT": closed, "HF_HOME": str(tmp_path / "hf")}
    for model in ("Qwen/Qwen2.5-0.5B-Instruct", "outputs/gsm8k-tools-grpo"):
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "trl_agentic.evaluate", "--model", model, "--task", "gsm8k_tools",
                               "--tool", "calculator", "--dataset", str(FIXTURES / "gsm8k_small.jsonl"),
                               "--output_dir", str(tmp_path / "eval")], capture_output=True, text=True, timeout=300,
                              env=env)
        seconds = time.monotonic() - start
        (error,) = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert error.startswith(f"error: could not load the model {model!r}: no such directory here, it is not in "
                                "the Hugging Face cache, and the hub (") and "HF_HUB_OFFLINE=1" in error
        assert seconds < 45, f"{seconds:.0f} s: retried the hub"  # imports take most of it on a loaded machine


def test_greedy_evaluation_records_the_real_log_probs(tiny_model_dir, tmp_path):
    """Greedy: each sampled token's log-prob is that of the model (a forward pass over the trajectory gives the
    same); an observation token keeps its 0.0 placeholder and the page shows no log-prob for it. Sampled: none is
    recorded (None), and the page says so instead of showing 0."""
    import re

    import torch
    from transformers import AutoModelForCausalLM

    common = ["--model", tiny_model_dir, "--task", "gsm8k_tools", "--tool", "calculator", "--dataset",
              str(FIXTURES / "gsm8k_small.jsonl"), "--max_rows", "2", "--max_tokens_per_turn", "8",
              "--max_completion_length", "32"]
    assert main([*common, "--greedy", "--output_dir", str(tmp_path / "greedy")]) == 0
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    rows = [json.loads(line) for line in (tmp_path / "greedy" / "trajectories.jsonl").read_text().splitlines()]
    for row in rows:
        ids = torch.tensor([row["prompt_ids"] + row["completion_ids"]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(row["prompt_ids"]) - 1 : -1].float()
        reference = torch.log_softmax(logits, -1).gather(-1, ids[0, len(row["prompt_ids"]) :, None]).squeeze(-1)
        for logprob, expected, mask in zip(row["logprobs"], reference.tolist(), row["env_mask"]):
            assert logprob == pytest.approx(expected, abs=1e-4) if mask else logprob == 0.0
    assert sum(row["env_mask"].count(1) for row in rows) > 0
    page = (tmp_path / "greedy" / "trajectories.html").read_text()
    shown = re.findall(r"log-prob (-?[0-9][0-9.e+-]*)", page)
    assert shown and all(float(value) < 0 for value in shown) and "log-prob not recorded" not in page

    assert main([*common, "--output_dir", str(tmp_path / "sampled")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "sampled" / "trajectories.jsonl").read_text().splitlines()]
    assert all(lp is None for row in rows for lp, m in zip(row["logprobs"], row["env_mask"]) if m)
    page = (tmp_path / "sampled" / "trajectories.html").read_text()
    assert "log-prob not recorded" in page and "log-prob 0" not in page


def test_vllm_generator_maps_the_turn_to_sampling_params(monkeypatch):
    """The --use_vllm seam against vLLM's offline API (LLM.generate with token prompts and SamplingParams): the turn
    budget, the stop strings kept in the output, every end id, greedy as temperature 0, the sampled token's
    log-prob. A stand-in module records the call here (the default suite has no vLLM); tests/vllm_engine/ runs the real
    engine."""
    import types

    from trl_agentic.rollout.vllm import VLLMGenerator

    recorded = {}

    class SamplingParams:
        def __init__(self, **kwargs):
            recorded["params"] = kwargs

    class LLM:
        def generate(self, prompts, params, use_tqdm):
            recorded["prompts"] = prompts
            steps = [{t: types.SimpleNamespace(logprob=-t / 10)} for t in (7, 8, 9)]
            return [types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=(7, 8, 9), logprobs=steps)])
                    for _ in prompts]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=SamplingParams))
    out = VLLMGenerator(LLM(), greedy=True, temperature=0.7, top_p=0.9, seed=3).generate(
        [[1, 2], [3]], 16, ["</calc>", "</answer>"], [5, 6])
    assert [g.ids for g in out] == [[7, 8, 9], [7, 8, 9]] and out[0].logprobs == [-0.7, -0.8, -0.9]
    assert recorded["prompts"] == [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [3]}]
    assert recorded["params"] == {"max_tokens": 16, "logprobs": 0, "stop": ["</calc>", "</answer>"],
                                  "include_stop_str_in_output": True, "stop_token_ids": [5, 6], "temperature": 0.0,
                                  "top_p": 1.0, "seed": 3}


def test_native_tool_calls_end_to_end(monkeypatch, tmp_path, capsys):
    """--tool calculator_native on a model with Qwen2.5-Instruct's real tool-calling template: the prompt shows
    calculate's schema, the model's <tool_call> is parsed and run, the result comes back as a tool message; the report,
    the trajectories (with the parsed calls) and the HTML (the calls and their results) say so."""
    from conventions import build_convention

    qwen = build_convention("qwen2.5-instruct")
    tok = qwen.tokenizer
    prompts = []

    def script(ids):
        text = tok.decode(ids)
        prompts.append(text)
        if "<tool_response>" not in text:
            return '<tool_call>\n{"name": "calculate", "arguments": {"expression": "(16 - 3 - 4) * 2"}}\n</tool_call><|im_end|>'
        return ("<answer>18</answer>" if "Janet" in text else "<answer>0</answer>") + "<|im_end|>"

    class Generator(ScriptedGenerator):
        def __init__(self, model, tokenizer, *args, **kwargs):
            super().__init__(tokenizer, script)

    monkeypatch.setattr(evaluate_module, "HFGenerator", Generator)
    out = tmp_path / "eval"
    argv = ["--model", qwen.model_dir, "--task", "gsm8k_tools", "--tool", "calculator_native", "--rollout_mode", "chat",
            "--dataset", str(FIXTURES / "gsm8k_small.jsonl"), "--max_rows", "2", "--max_completion_length", "200",
            "--output_dir", str(out)]
    assert main(argv) == 0
    assert '"name": "calculate"' in prompts[0] and "<tools>" in prompts[0]  # the template rendered the schema
    report = json.loads((out / "report.json").read_text())
    assert report["successes"] == [1, 0] and report["mean_tool_calls"] == 1 and report["mean_turns"] == 2
    rows = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert rows[0]["messages"] == [
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "calculate", "arguments": {"expression": "(16 - 3 - 4) * 2"}}}]},
        {"role": "tool", "name": "calculate", "content": "18"},
        {"role": "assistant", "content": "<answer>18</answer>"},
    ]
    page = (out / "trajectories.html").read_text()
    assert page.count("Tool calls (native)") == 2
    assert "calculate({&quot;expression&quot;: &quot;(16 - 3 - 4) * 2&quot;}) → 18</li>" in page


# -- the trainers' arguments (issue 58): a TRL environment class, its rows, the user's reward functions -------------
USER_MODULE = '''
DEFINITIONS = {"wen": "a small cyst", "gry": "a unit of measure"}


class Dictionary:
    def reset(self, word, **kwargs):
        self.word = word

    def define(self, word: str) -> str:
        """Look up the definition of a word.

        Args:
            word: The word to look up.
        """
        return DEFINITIONS.get(word, "unknown word")


def defined(completions, word, **kwargs):
    return [float(DEFINITIONS[w] in (c[-1]["content"] or "")) for c, w in zip(completions, word)]
'''


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    """A user's module (a TRL environment class, a reward function) and dataset, the current directory importable."""
    (tmp_path / "my_dictionary.py").write_text(USER_MODULE)
    rows = [{"prompt": [{"role": "user", "content": f"Define {w}."}], "word": w} for w in ("wen", "gry")]
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_an_environment_factory_class_is_evaluated_with_the_users_reward(user_files, monkeypatch, capsys):
    """The command takes --environment_factory and --reward_funcs as trl-agentic grpo does: the class's tools are
    called, the user's reward scores, the report and trajectories are written."""
    from conventions import build_convention

    qwen = build_convention("qwen2.5-instruct")

    def script(ids):  # call the tool first, then answer with the definition the tool returned
        text = qwen.tokenizer.decode(ids)
        if "<tool_response>" not in text:
            word = "wen" if "Define wen" in text else "gry"
            return '<tool_call>\n{"name": "define", "arguments": {"word": "%s"}}\n</tool_call><|im_end|>' % word
        return text.rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>")[0] + "<|im_end|>"

    class Generator(ScriptedGenerator):
        def __init__(self, model, tok, *args, **kwargs):
            super().__init__(tok, script)

    monkeypatch.setattr(evaluate_module, "HFGenerator", Generator)
    argv = ["--model", qwen.model_dir, "--environment_factory", "my_dictionary.Dictionary", "--reward_funcs",
            "my_dictionary.defined", "--dataset", "test.jsonl", "--greedy", "--max_completion_length", "128",
            "--output_dir", "eval"]
    assert main(argv) == 0
    report = json.loads((user_files / "eval" / "report.json").read_text())
    assert report["accuracy"] == 1.0 and report["mean_tool_calls"] == 1.0
    assert report["reward_means"] == {"defined": 1.0} and report["task_arguments"] is None
    assert report["rollout"]["rollout_mode"] == "chat"  # implied by native tool calls, as in training
    assert "my_dictionary.Dictionary" in (user_files / "eval" / "trajectories.html").read_text()
    assert "accuracy 1.000" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--environment_factory", "my_dictionary.Dictionary"], "nothing scores --environment_factory: pass --reward_funcs"),
    (["--environment", "my_dictionary.Dictionary", "--reward_funcs", "my_dictionary.defined"],
     "pass environment_factory=Dictionary"),
    (["--environment_factory", "my_dictionary.Dictionary", "--reward_funcs", "correctness"],
     "--reward_funcs 'correctness': pass one of TRL's names"),
])
def test_the_trainers_arguments_are_refused_in_one_line(user_files, argv, message, capsys):
    from conventions import build_convention

    argv = ["--model", build_convention("qwen2.5-instruct").model_dir, "--dataset", "test.jsonl", *argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err, err
