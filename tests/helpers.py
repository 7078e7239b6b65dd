"""Test doubles shared by the tests: scripted generators and environments."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import textwrap
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

from transformers import TrainerCallback

from trl_agentic.environments.base import StepResult
from trl_agentic.rollout.generation import Generation


class ScriptedGenerator:
    """Returns, for each prompt, the ids of the next scripted text (chosen by a callback on the prompt ids), and
    records every call, as a stand-in for a generation backend (HF generate or vLLM)."""

    def __init__(self, tokenizer: Any, script: Any, extra_after_stop: str = "") -> None:
        self.tokenizer = tokenizer
        self.script = script  # callable(prompt_ids) -> str
        self.extra_after_stop = extra_after_stop
        self.calls: list[dict[str, Any]] = []

    def generate(
        self, prompts: list[list[int]], max_new_tokens: int, stop_strings: Sequence[str], eos_token_ids: Sequence[int]
    ) -> list[Generation]:
        self.calls.append({"batch": len(prompts), "max_new_tokens": max_new_tokens, "stop": list(stop_strings),
                           "eos_token_ids": list(eos_token_ids)})
        out = []
        for ids in prompts:
            text = self.script(ids) + self.extra_after_stop
            new = self.tokenizer(text, add_special_tokens=False)["input_ids"][:max_new_tokens]
            out.append(Generation(ids=new, logprobs=[-0.5] * len(new)))
        return out


class EchoEnvironment:
    """Counts turns; observation ``<obs>n</obs>``; done after ``turns`` steps; optional failures by row."""

    def __init__(self, turns: int = 2) -> None:
        self.turns = turns
        self.n = 0
        self.fail = None

    def reset(self, **example: Any) -> str | None:
        self.n = 0
        self.fail = example.get("fail")
        self.turns = example.get("turns", self.turns)
        if self.fail == "reset":
            raise RuntimeError("reset failed")
        return None

    def step(self, action: str) -> StepResult:
        self.n += 1
        if self.fail == "step":
            raise ValueError("step failed")
        if self.fail == "hang":
            import time

            time.sleep(5)
        if self.fail == "flood":
            return StepResult(observation="x" * 10_000_000, reward=0.0)
        return StepResult(observation=f"<result>{self.n}</result>", reward=float(self.n),
                          terminated=self.n >= self.turns)


def lookup_dataset(n: int = 8, conversational: bool = False):
    from datasets import Dataset

    from trl_agentic.toy import make_lookup_dataset

    return Dataset.from_list(make_lookup_dataset(n, conversational=conversational))


def even_rows_right(tokenizer, rows) -> ScriptedGenerator:
    """A lookup agent that looks up, then answers right for even rows and wrong for odd ones (every sample of a row
    alike)."""
    values = {row["prompt"]: row["value"] for row in rows}

    def script(ids):
        text = tokenizer.decode(ids)
        if "<result>" not in text:
            return "<lookup>k</lookup>"
        prompt = next(p for p in values if text.startswith(p))
        return f"<answer>{values[prompt] if list(values).index(prompt) % 2 == 0 else 'x'}</answer>"

    return ScriptedGenerator(tokenizer, script)


def sandbox_backends() -> list[str]:
    """The code-sandbox backends that work on this machine: ``bwrap`` only when a bubblewrap sandbox starts here."""
    from trl_agentic.tools import detect_sandbox_backend

    backends = ["subprocess"]
    if detect_sandbox_backend()[0] == "bwrap":
        backends.insert(0, "bwrap")
    return backends


def _small_config(config_class, tmp_path, **overrides):
    """A small, CPU-friendly trainer config."""
    kwargs = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        max_completion_length=48,
        max_tokens_per_turn=12,
        max_turns=3,
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        save_strategy="no",
    )
    kwargs.update(overrides)
    return config_class(**kwargs)


def agentic_args(tmp_path, **overrides):
    from trl_agentic import AgenticGRPOConfig

    return _small_config(AgenticGRPOConfig, tmp_path, **{"num_generations": 2, **overrides})


def ppo_args(tmp_path, **overrides):
    from trl_agentic import AgenticPPOConfig

    return _small_config(AgenticPPOConfig, tmp_path, **{"num_generations": 1, "beta": 0.05, **overrides})


REPO = Path(__file__).resolve().parents[1]


def run_isolated(code: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Run ``code`` (dedented) in a Python process of its own with the repository and ``tests/`` importable (forked
    from a server with torch, transformers and TRL imported: ``tests/forkserver.py``). A run that outlasts
    ``timeout`` seconds fails the calling test with the output so far (for tests whose failure mode is a hang)."""
    import pytest
    from forkserver import run_python

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")])
    try:
        return run_python(["-c", textwrap.dedent(code)], env=env, cwd=os.getcwd(), timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        def text(b: Any) -> str:
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")

        pytest.fail(f"hung: no result after {timeout} s\nstdout:\n{text(exc.stdout)[-2000:]}\nstderr:\n{text(exc.stderr)[-2000:]}")


def completion_hidden_grad(model: Any, batch: Any, loss_fn: Any) -> Any:
    """|d loss / d h| at each completion position, (B, C): ``h`` is the final-norm output, which feeds only its own
    position's logits (TRL computes log-probs with a fused LM head, so logits are never materialised). Position
    ``P - 1 + j`` predicts completion token ``j``. ``batch`` is a ``TRLBatch`` or TRL's dict."""
    import torch  # noqa: F401 - the hook returns tensors

    data = getattr(batch, "data", batch)
    captured = {}

    def keep_hidden(module, inputs, output):
        output.retain_grad()
        captured["hidden"] = output

    final_norm = next(m for name, m in model.named_modules() if name.endswith("model.norm"))
    handle = final_norm.register_forward_hook(keep_hidden)
    try:
        loss_fn().backward()
    finally:
        handle.remove()
    prompt_len, width = data["prompt_ids"].size(1), data["completion_ids"].size(1)
    return captured["hidden"].grad[:, prompt_len - 1 : prompt_len - 1 + width].abs().sum(-1)


def agent_tokens_reward(completions, trajectory, **kwargs):
    """Varies between completions of a group, so that every step has non-zero advantages."""
    return [t.num_agent_tokens / 10 for t in trajectory]


def trl_replay(model_dir, tokenizer, args, reward_funcs, trajectories, rows):
    """TRL 1.16's own round on given trajectories: a plain ``GRPOTrainer`` (``args``' GRPOConfig fields) whose
    ``rollout_func`` hands TRL each trajectory's prompt ids, completion ids and env mask (a row left empty gets one
    masked pad token; a failed environment trains no token) and the trajectory, as an extra field for the reward
    functions. Returns the trainer and its batch for ``rows`` (the reference for our own round)."""
    import dataclasses

    from trl import GRPOConfig, GRPOTrainer

    def replay(prompts, trainer):
        pad = tokenizer.pad_token_id
        ids = [list(t.completion_ids) or [pad] for t in trajectories]
        masks = [[0] * len(i) if t.env_failed else (list(t.env_mask) or [0]) for t, i in zip(trajectories, ids)]
        return {"prompt_ids": [list(t.prompt_ids) for t in trajectories], "completion_ids": ids, "logprobs": None,
                "env_mask": masks, "trajectory": list(trajectories)}

    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(GRPOConfig) if f.init}
    values.update(generation_batch_size=None, output_dir=args.output_dir + "-trl")
    trainer = GRPOTrainer(model=model_dir, reward_funcs=reward_funcs, args=GRPOConfig(**values),
                          processing_class=tokenizer, rollout_func=replay, train_dataset=lookup_dataset(8))
    trainer.model.train()
    return trainer, trainer._generate_and_score_completions([dict(r) for r in rows])


class Drift(TrainerCallback):
    """Mean |delta log-prob| of a fixed sequence (``ids``, a ``1 x n`` tensor) under the model, from before training
    to after each step: how far one optimizer step moves the model, against which the vLLM tests compare the
    trainer/vLLM log-prob gap (a gap far below the drift means the new weights reached vLLM)."""

    def __init__(self, ids):
        self.ids, self.before, self.after_step = ids, None, {}

    def _logps(self, model):
        import torch

        with torch.no_grad():
            logits = model(input_ids=self.ids).logits[:, :-1].float()
        return torch.log_softmax(logits, -1).gather(-1, self.ids[:, 1:, None]).squeeze(-1)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.before = self._logps(model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.after_step[state.global_step] = (self._logps(model) - self.before).abs().mean().item()


class Recording:
    """Wraps a generator (the generation seam) and keeps every output it returned: ids and log-probs per call."""

    def __init__(self, inner):
        self.inner, self.outputs = inner, []

    def generate(self, prompts, max_new_tokens, stop_strings, stop_token_ids):
        out = self.inner.generate(prompts, max_new_tokens, stop_strings, stop_token_ids)
        self.outputs.append([(list(g.ids), list(g.logprobs)) for g in out])
        return out


# -- native tool calls on a tiny model: a random model never writes a well-formed call, so its turns are scripted ------
ASSISTANT_HEADER = "<|im_start|>assistant\n"


def native_call(name: str, **arguments: Any) -> str:
    """A Qwen-style native tool call (``<tool_call>{json}</tool_call>``)."""
    import json

    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class ScriptedLogits:
    """Forces, on every row, the tokens of turn ``k`` of ``turns`` (``k`` = assistant headers in the context - 1),
    then ``<|im_end|>``: the same token streams for any trainer, whatever the weights."""

    def __init__(self, tokenizer: Any, turns: Sequence[str]) -> None:
        encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.header = encode(ASSISTANT_HEADER)
        self.turns = [encode(text) + [self.end] for text in turns]

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        out = torch.full_like(scores, float("-inf"))
        n = len(self.header)
        for row, ids in enumerate(input_ids.tolist()):
            starts = [i for i in range(len(ids) - n + 1) if ids[i:i + n] == self.header]
            turn = self.turns[min(len(starts) - 1, len(self.turns) - 1)]
            offset = len(ids) - starts[-1] - n
            out[row, turn[offset] if offset < len(turn) else self.end] = 0.0
        return out


def scripted(model: Any, tokenizer: Any, turns: Sequence[str]) -> Any:
    """``model.generate`` with the script's logits processor added (instance attribute; test double only)."""
    from transformers import LogitsProcessorList

    original, script = model.generate, ScriptedLogits(tokenizer, turns)

    def generate(*args: Any, **kwargs: Any) -> Any:
        processors = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
        processors.append(script)
        return original(*args, logits_processor=processors, **kwargs)

    model.generate = generate
    return model


def fail_when_set(flag: Any, action: str, module: Any, args: Any) -> None:
    """A forward pre-hook for a model that crosses into a generator process (``functools.partial(fail_when_set,
    flag, action)``; ``flag``: a two-element tensor in shared memory): once the test sets ``flag[0]``, the next
    forward in that process raises (``"raise"``), kills its process with SIGKILL (``"kill"``, as a segfault or the
    OOM killer would), does so after forking a process that keeps its files open for 30 s (``"orphan"``, its pid in
    ``flag[1]``) or sleeps for a minute (``"sleep"``)."""
    import signal
    import time

    if not flag[0]:
        return
    if action == "raise":
        raise KeyError("the generator's card fell over")
    if action == "orphan":
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        flag[1] = pid
    if action in ("kill", "orphan"):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)


def raised_within(call: Callable[[], Any], seconds: float) -> BaseException | None:
    """The exception ``call()`` raises (``None`` if it returns), run on a daemon thread; the test fails if it still
    runs after ``seconds``, so a hang fails instead of blocking the suite."""
    outcome: dict[str, BaseException] = {}

    def target() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s: a hang"
    return outcome.get("error")


def assert_rounds_behind(trainer: Any, steps: int, batch: int, depth: int = 1) -> None:
    """A ``max_staleness=depth`` run of ``steps`` rounds of ``batch`` samples: finite losses, staleness 0, 1, ...,
    ``depth`` over the first steps and ``depth`` after, every started sample trained once or discarded (the
    ``depth`` rounds left ahead at the end)."""
    import math

    logs = [row for row in trainer.state.log_history if "loss" in row]
    assert len(logs) == steps and all(math.isfinite(row["loss"]) for row in logs)
    assert [row["async/staleness"] for row in logs] == [float(min(step, depth)) for step in range(steps)]
    pipeline = trainer.rollout_source
    assert (pipeline.consumed, pipeline.discarded) == (batch * steps, batch * depth)
    assert pipeline.started == pipeline.consumed + pipeline.discarded


def accelerate_launch() -> list[str]:
    """``accelerate launch`` on a rendezvous port of its own (a free one the OS picked): two launches at once, or one
    right after another whose port is still held, never meet on torchrun's default 29500. Skips without the CLI."""
    import pytest

    if shutil.which("accelerate") is None:
        pytest.skip("accelerate CLI not on PATH")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return ["accelerate", "launch", "--main_process_port", str(port)]


def launch_two_processes(script: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``script`` with ``args`` on two CPU processes (``accelerate launch --multi_gpu``, gloo), the checkout first on
    ``PYTHONPATH``; the finished process (its stdout and stderr captured)."""
    cmd = [*accelerate_launch(), "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
           "no", "--dynamo_backend", "no", str(script), *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
