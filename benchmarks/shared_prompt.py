"""A prompt shared by a GRPO group, prefilled once per round: agents through the OpenAI-compatible endpoint that all
send one long system prompt and tool schemas (as Codex CLI and Claude Code do, 10-20 k tokens), with and without the
KV cache kept across the round's ``generate`` calls (issue 60).

    python benchmarks/shared_prompt.py [--prompt-tokens 10000] [--group 8] [--turns 3] [--stagger 0.05]
                                       [--repeats 1] [--json FILE]

The workload: a random Qwen2 (``--hidden 64 --layers 2``, 32,768 positions) over the tiny Qwen2.5-Instruct tokenizer
and chat template of ``tests/conventions.py`` (538 ids, about 1.6 characters an id: 10,000 ids are about 16 KB of
text; what prefill and the cache cost is the number of ids, here that of a 10 k-token prompt such as Codex CLI's
first request of about 40 KB). Each of the ``--group`` agents (the OpenAI SDK, ``async``) sends the same
first request, as the trajectories of one GRPO group do: a system prompt of coding-agent instructions and ``--tools``
tool schemas with long descriptions (the ``lookup`` tool among them), sized so that the rendered prompt is about
``--prompt-tokens`` ids, and the task. Its ``generate`` is forced by ``rollout_speed.py``'s logits processor to call
``lookup`` in each turn but the last of ``--turns`` and then answer, each turn ``--tokens-per-turn`` tokens (every
forward pass still runs). Agent ``i`` sends its first request ``i * --stagger`` seconds after the first agent (CLI
processes start apart), so the group's first requests reach the generator in several ``generate`` calls.

Two sides, in one process, on the same model and the same agents (``--repeats`` rollouts each, alternating; each
after a short rollout of two agents with a one-tool prompt, so that both start warm and with the bridge, which paces
its rounds by the last generation's time, in the same state):

- ``reprefill``: ``HFGenerator(keep_cache=False)`` (``prefix_caching=False``): every request prefills its whole
  conversation, as TRL's tool loop and any backend without prefix caching do;
- ``cache``: the default, the KV cache kept across the round's calls (``trl_agentic/rollout/prefix_cache.py``): any
  row reuses the longest prefix any earlier row of the round computed, and what the rows of one call share is
  prefilled once before it.

Per side (medians over the repeats): the rollout's wall and process CPU seconds, the ``generate`` calls and their
rows, the prompt ids the requests carried per trajectory, the ids prefilled per trajectory (the generator's
``prefilled_tokens`` over ``--group``; ``shared``: of them, those prefilled ahead of a call for its rows to share),
and for ``cache`` the most positions its kept cache held (``peak_cached_tokens``: a position shared by several
trajectories once) against the positions one kept sequence per trajectory holds (each trajectory's conversation, its
shared prompt again: how the cache was laid out before issue 60), in MiB at the model's bytes per position. Beside
them, computed from the token counts: the ids a cache kept per trajectory only would prefill (its first prompt, then
each turn's last sampled id and observation). The script checks that both sides recorded identical trajectories.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_endpoint import lookup_schema, make_agent, rollout_config, scripted_setup  # noqa: E402
from rollout_speed import PROMPT, Lookup, machine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
INSTRUCTION = ("Rule {k}: when you edit a file, read it first, keep the change minimal, run the tests in the working "
               "directory, and report what you changed and why in one short paragraph.")
TOOL_NAMES = ("shell", "apply_patch", "read_file", "list_dir", "grep_files", "update_plan", "view_image", "web_fetch",
              "write_file", "run_tests", "git_diff", "git_status", "search_symbols", "open_url", "ask_user")


def tool_schemas(count: int) -> list[dict[str, Any]]:
    """``lookup`` (the tool the scripted turns call) and ``count - 1`` coding-agent tools with long descriptions."""
    tools = [lookup_schema(Lookup(0.0))]
    for k in range(count - 1):
        name = TOOL_NAMES[k % len(TOOL_NAMES)] + ("" if k < len(TOOL_NAMES) else f"_{k // len(TOOL_NAMES)}")
        description = " ".join(INSTRUCTION.format(k=f"{name}.{j}") for j in range(6))
        tools.append({"type": "function", "function": {
            "name": name, "description": description,
            "parameters": {"type": "object", "required": ["path"], "properties": {
                "path": {"type": "string", "description": "The file or folder, relative to the working directory."},
                "content": {"type": "string", "description": "What to write, or the patch to apply, as text."}}}}})
    return tools


def system_prompt(tokenizer: Any, tools: list[dict[str, Any]], target: int) -> tuple[str, int]:
    """Instructions enough for the first request (system prompt, ``tools``, the task) to render to about ``target``
    ids, and the ids it renders to."""
    def size(text: str) -> int:
        messages = [{"role": "system", "content": text}, *PROMPT]
        return len(tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)["input_ids"])

    base, one = size("You are a coding agent."), size("You are a coding agent. " + INSTRUCTION.format(k=0))
    count = max(0, round((target - base) / max(1, one - base)))
    text = "You are a coding agent. " + " ".join(INSTRUCTION.format(k=k) for k in range(count))
    return text, size(text)


def per_trajectory_cache(trajectories: list[Any]) -> float:
    """The ids a cache kept per trajectory only prefills, per trajectory: its first prompt, then in each later turn
    the last id sampled in the turn before (never fed) and what was appended after it (computed, not run)."""
    total = 0
    for t in trajectories:
        total += len(t.prompt_ids)
        total += sum(1 + t.turn_spans[k + 1][0] - t.turn_spans[k][1] for k in range(len(t.turn_spans) - 1))
    return total / len(trajectories)


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from trl_agentic.agents import Agent, AgentRollout
    from trl_agentic.rollout.generation import HFGenerator

    tokenizer, model, log, eos = scripted_setup(args)
    tool = Lookup(0.0)
    tools = tool_schemas(args.tools)
    system, prompt_tokens = system_prompt(tokenizer, tools, args.prompt_tokens)
    if prompt_tokens + args.turns * (args.tokens_per_turn + 64) > model.config.max_position_embeddings:
        raise SystemExit(f"--prompt-tokens {args.prompt_tokens} leaves no room for {args.turns} turns in the model's "
                         f"{model.config.max_position_embeddings} positions: pass a smaller --prompt-tokens")
    config = rollout_config(args, env_timeout=3600.0)
    rollout = AgentRollout(Agent(make_agent(tool, tools), batch_window=args.window), tokenizer, config, eos)
    text = model.config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    bytes_per_position = text.num_hidden_layers * 2 * text.num_key_value_heads * head_dim * model.dtype.itemsize
    rows = [{"system": system, "delay": i * args.stagger} for i in range(args.group)]
    short = [{"system": "You are a coding agent.", "tools": tools[:1]}] * 2
    sides = {"reprefill": False, "cache": True}
    measured: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    reference = None
    for repeat in range(args.repeats):
        for name in (sides if repeat % 2 == 0 else reversed(sides)):
            generator = HFGenerator(model, tokenizer, keep_cache=sides[name])
            # a short rollout first: imports and the SDK warm, and the bridge, which paces a round by the last
            # generation's time, starts each measured rollout alike
            rollout.run(short, generator)
            generator = HFGenerator(model, tokenizer, keep_cache=sides[name])
            log.clear()
            torch.manual_seed(0)
            start, cpu = time.perf_counter(), time.process_time()
            out = rollout.run(rows, generator)
            seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
            if any(t.stop_reason != "terminated" or t.num_turns != args.turns for t in out):
                raise SystemExit(f"{name}: unexpected runs: {[(t.stop_reason, t.num_turns, t.error) for t in out][:3]}")
            recorded = [(t.prompt_ids, t.completion_ids, t.env_mask) for t in out]
            if reference is None:
                reference = recorded
            elif recorded != reference:
                raise SystemExit(f"{name}: the trajectories differ from the other side's")
            requested = generator.prefilled_tokens - generator.shared_tokens + generator.reused_tokens
            conversations = sum(len(t.prompt_ids) + len(t.completion_ids) - 1 for t in out)
            measured[name].append({
                "wall_s": seconds, "cpu_s": cpu_seconds, "generate_calls": len(log.rows), "rows_per_call": log.rows,
                "prompt_tokens_per_trajectory": requested / args.group,
                "prefilled_per_trajectory": generator.prefilled_tokens / args.group,
                "shared_prefilled": generator.shared_tokens,
                "per_trajectory_cache_prefilled_per_trajectory": per_trajectory_cache(out),
                "peak_cached_tokens": generator.peak_cached_tokens,
                "per_trajectory_entries_tokens": conversations if sides[name] else 0,
                "load_average": os.getloadavg()[0]})
            print(json.dumps({"side": name, **{k: round(v, 3) if isinstance(v, float) else v
                                                for k, v in measured[name][-1].items()}}), flush=True)
    rollout.close()
    results = {}
    for name, runs in measured.items():
        numbers = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "rows_per_call"}
        numbers["rows_per_call"] = runs[0]["rows_per_call"]
        numbers["peak_cached_mib"] = numbers["peak_cached_tokens"] * bytes_per_position / 2 ** 20
        numbers["per_trajectory_entries_mib"] = numbers["per_trajectory_entries_tokens"] * bytes_per_position / 2 ** 20
        numbers["runs"] = runs
        results[name] = numbers
    return {"command": "python " + " ".join(["benchmarks/shared_prompt.py", *sys.argv[1:]]), "commit": commit(),
            "settings": vars(args), "prompt_tokens": prompt_tokens, "bytes_per_position": bytes_per_position,
            "machine": machine(), "results": results,
            "ratios": {"prefilled": results["cache"]["prefilled_per_trajectory"]
                       / results["reprefill"]["prefilled_per_trajectory"],
                       "wall_s": results["cache"]["wall_s"] / results["reprefill"]["wall_s"],
                       "cpu_s": results["cache"]["cpu_s"] / results["reprefill"]["cpu_s"]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-tokens", type=int, default=10000, help="ids of the first request (about)")
    parser.add_argument("--tools", type=int, default=12, help="tool schemas in every request")
    parser.add_argument("--group", type=int, default=8, help="trajectories of the GRPO group (concurrent agents)")
    parser.add_argument("--turns", type=int, default=3, help="model turns per trajectory (tool calls + answer)")
    parser.add_argument("--tokens-per-turn", type=int, default=32)
    parser.add_argument("--stagger", type=float, default=0.05,
                        help="seconds between the agents' first requests (CLI processes start apart)")
    parser.add_argument("--repeats", type=int, default=1, help="measured rollouts per side (after a warm-up)")
    parser.add_argument("--window", type=float, default=0.02, help="the agents' batch_window, seconds")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--json", help="write the measurements to this file")
    args = parser.parse_args()
    report = run(args)
    print(f"prompt: {report['prompt_tokens']} ids, group {args.group}, {args.turns} turns")
    print(f"{'side':>9}  {'wall s':>7}  {'cpu s':>7}  {'calls':>5}  {'prompt ids/traj':>15}  {'prefilled/traj':>14}  "
          f"{'per-traj cache':>14}  {'cache MiB':>9}  {'entries MiB':>11}")
    for name, r in report["results"].items():
        print(f"{name:>9}  {r['wall_s']:>7.2f}  {r['cpu_s']:>7.2f}  {r['generate_calls']:>5.0f}  "
              f"{r['prompt_tokens_per_trajectory']:>15.1f}  {r['prefilled_per_trajectory']:>14.1f}  "
              f"{r['per_trajectory_cache_prefilled_per_trajectory']:>14.1f}  {r['peak_cached_mib']:>9.2f}  "
              f"{r['per_trajectory_entries_mib']:>11.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
