"""Two CPU processes through TRL's real vLLM backend: every trajectory's sampled ids come from its own prompt.

TRL 1.16's ``VLLMGeneration.generate`` gathers the prompts of every process (server mode: all processes; colocate
with tensor parallelism: the TP group) and hands process ``i`` the slice starting at ``i * len(prompts)``. Our rollout
sends each turn only the trajectories still active, so the processes send different counts; ``vllm_ranks.py`` makes
them differ in both directions and records, per turn, the ids each trajectory got. The stubs
(``vllm_stubs.py``) stand in only for the transport (``VLLMClient``) and the engine (``vllm.LLM``): the gathering and
slicing under test are TRL's own code.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import accelerate_launch
from vllm_stubs import encode

pytestmark = pytest.mark.multiprocess

MODES = ("server", "colocate_tp")
ASYNC = "server_async"  # server mode, max_staleness=1: each process's own requests, from its background thread


@pytest.fixture(scope="module")
def launched(tmp_path_factory, tiny_model_dir):
    """One two-process launch running every mode; returns (the launch's result, the output folder)."""
    out = tmp_path_factory.mktemp("vllm-ranks")
    script = Path(__file__).with_name("vllm_ranks.py")
    cmd = [*accelerate_launch(), "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
           "no", "--dynamo_backend", "no", str(script), str(out), tiny_model_dir, *MODES, ASYNC]
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env), out


def _ranks(out: Path, mode: str) -> list[dict]:
    paths = [out / f"rank{k}_{mode}.json" for k in range(2)]
    if not all(p.exists() for p in paths):
        return []
    return [json.loads(p.read_text()) for p in paths]


def _mixed_up(rank: dict) -> list[str]:
    """Every turn whose sampled ids are not those of the trajectory's own input at that turn."""
    wrong = []
    for r, round_ in enumerate(rank["rounds"]):
        for j, t in enumerate(round_["trajectories"]):
            for k, (start, _) in enumerate(t["turn_spans"]):
                sent = t["prompt_ids"] + t["completion_ids"][:start]
                if t["generated_ids"][k] != encode(sent):
                    wrong.append(f"round {r}, trajectory {j}, turn {k}: got {t['generated_ids'][k]}, "
                                 f"its prompt's are {encode(sent)}")
    return wrong


@pytest.mark.parametrize("mode", MODES)
def test_every_trajectory_gets_its_own_tokens(launched, mode):
    proc, out = launched
    ranks = _ranks(out, mode)
    for k, rank in enumerate(ranks):  # what came back before any crash
        wrong = _mixed_up(rank)
        assert wrong == [], f"process {k} ({mode}) got another prompt's tokens:\n" + "\n".join(wrong[:8])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert len(ranks) == 2 and [len(r["rounds"]) for r in ranks] == [2, 2]
    for r in range(2):
        rounds = [rank["rounds"][r] for rank in ranks]
        for rank_round in rounds:  # every scheduled turn happened, with ids that came from vLLM
            assert sorted(len(t["turn_spans"]) for t in rank_round["trajectories"]) == sorted(rank_round["turns"])
        sent0, sent1 = rounds[0]["sent"], rounds[1]["sent"]
        assert len(sent0) == len(sent1) and sent0 != sent1  # aligned calls, unequal counts
    # round 0: process 1 sends fewer prompts than process 0 in some turn; round 1: more
    assert any(a > b for a, b in zip(ranks[0]["rounds"][0]["sent"], ranks[1]["rounds"][0]["sent"]))
    assert any(a < b for a, b in zip(ranks[0]["rounds"][1]["sent"], ranks[1]["rounds"][1]["sent"]))


def test_server_sees_every_process_padded_to_the_same_count(launched):
    """The cost of the fix: each request holds max-over-processes prompts per process (padding, dropped after)."""
    proc, out = launched
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = _ranks(out, "server")
    for r in range(2):
        sent = zip(ranks[0]["rounds"][r]["sent"], ranks[1]["rounds"][r]["sent"])
        assert ranks[0]["rounds"][r]["served"] == [2 * max(a, b) for a, b in sent]
        assert ranks[1]["rounds"][r]["served"] == []  # only the main process talks to the server


def test_asynchronous_rollouts_send_each_process_own_prompts(launched):
    """max_staleness=1 on the server: no gather and no padding (nothing collective on the background thread); each
    process's client serves exactly its own prompts, every trajectory gets its own tokens, and both processes train
    one round behind after the first."""
    proc, out = launched
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = _ranks(out, ASYNC)
    ends = [json.loads((out / f"rank{k}_{ASYNC}_end.json").read_text()) for k in range(2)]
    for rank, end in zip(ranks, ends):
        rounds = [r for r in rank["rounds"] if "trajectories" in r]  # a job stopped at the end records none
        assert len(rounds) >= 2 and _mixed_up({"rounds": rounds}) == []
        assert all(r["sent"] == [] for r in rounds)  # not TRL's gathering generate
        assert end["served"] and max(end["served"]) <= 3  # this process's 3 trajectories at most, never padded
        assert end["staleness"] == [0.0, 1.0]
