"""TRL 1.16's documented agent examples (``docs/source/grpo_trainer.md``, "Agent Training": tools, an environment
that owns its data, one fed by a dataset, several environments) and the patterns of its example scripts
(``examples/scripts/grpo_agent.py``: a SQL tool on a sqlite database with a ``signal.alarm`` timeout;
``examples/scripts/grpo_2048.py``: a game whose move raises when the game is over), re-written as scenarios and run
on TRL's trainer and ours with only the class (and the config class) swapped."""

from __future__ import annotations

import random
import signal
import sqlite3
from contextlib import contextmanager

from harness import FLAVOURS, by_rows, by_turn, call, policy, run, same_figures, zen

QWEN3 = dict(chat_template_kwargs={"enable_thinking": False})  # as the docs' Qwen3 examples


# -- "Tools" -------------------------------------------------------------------------------------------------------
def multiply(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


async def async_add(a: int, b: int) -> int:
    """
    Asynchronously adds two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The sum of the two integers.
    """
    return a + b


def _found_twelve(completions, **kwargs):
    return [float(any(m["role"] == "tool" and m["content"] == "12" for m in c)) for c in completions]


def test_tools_example(tmp_path):
    first = [call("multiply", a=3, b=4) + "<|im_end|>", call("async_add", a=3, b=4) + "<|im_end|>",
             "I know it.<|im_end|>", call("multiply", a=2, b=2) + "\n" + call("async_add", a=1, b=1) + "<|im_end|>"]
    script = by_rows(first, ["It is.<|im_end|>"] * 3)
    config = dict(learning_rate=0.1, per_device_train_batch_size=4, num_generations=2, max_completion_length=128,
                  max_steps=2, **QWEN3)
    runs = {f: run(f, tmp_path, script, model=policy("qwen3"), config=config, reward_funcs=_found_twelve,
                   train_dataset=zen(), tools=[multiply, async_add]) for f in FLAVOURS}
    for r in runs.values():
        assert r.error is None and r.params_changed, (r.flavour, r.error)
        assert r.last("tools/call_frequency") == 1.0, r.flavour  # 1 + 1 + 0 + 2 calls over 4 rollouts
    for flavour in ("ours", "ours+config"):
        same_figures(runs["trl"], runs[flavour])


# -- "Environments": one that owns its data, one fed by a dataset ----------------------------------------------------
class IncrementEnv:
    """The docs' environment that owns its data: ``reset`` draws a target and writes the prompt."""

    def reset(self, **kwargs) -> str | None:
        self.counter = 0
        self.target = random.randint(1, 6)
        return f"Increment the counter by {self.target}."

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


def test_environment_that_owns_its_data(tmp_path):
    """No dataset, no reward function: reset() writes the prompt, get_reward() scores; TRL's placeholder rows."""
    first = [call("increment", step=1) + "<|im_end|>", call("increment", step=4) + "<|im_end|>"] * 2
    script = by_turn(first, ["Done.<|im_end|>"] * 4)
    config = dict(per_device_train_batch_size=4, num_generations=2, max_completion_length=128, max_steps=2, **QWEN3)
    runs = {}
    for flavour in FLAVOURS:
        random.seed(0)
        runs[flavour] = r = run(flavour, tmp_path, script, model=policy("qwen3"), config=config,
                                environment_factory=IncrementEnv)
        assert r.error is None and r.trainer.reward_func_names == ["IncrementEnv"], (flavour, r.error)
        assert r.last("tools/call_frequency") == 1.0, flavour
    for flavour in ("ours", "ours+config"):
        same_figures(runs["trl"], runs[flavour])


class DatasetIncrementEnv(IncrementEnv):
    """The docs' environment fed by a dataset: the row's ``target`` column reaches ``reset``."""

    def reset(self, target, **kwargs) -> None:
        self.counter = 0
        self.target = target


def test_environment_with_a_dataset(tmp_path):
    from datasets import Dataset

    dataset = Dataset.from_dict({
        "prompt": [[{"role": "user", "content": f"Increment the counter to {i}."}] for i in range(1, 7)],
        "target": list(range(1, 7)),
    })
    first = [call("increment", step=2) + "<|im_end|>", call("increment", step=1) + "<|im_end|>"] * 2
    script = by_turn(first, ["Done.<|im_end|>"] * 4)
    config = dict(per_device_train_batch_size=4, num_generations=2, max_completion_length=128, max_steps=3,
                  shuffle_dataset=False, **QWEN3)
    runs = {f: run(f, tmp_path, script, model=policy("qwen3"), config=config, train_dataset=dataset,
                   environment_factory=DatasetIncrementEnv) for f in FLAVOURS}
    for r in runs.values():
        assert r.error is None, (r.flavour, r.error)
        rewards = [e["rewards/DatasetIncrementEnv/mean"] for e in r.logs if "rewards/DatasetIncrementEnv/mean" in e]
        assert rewards == [0.5, 0.0, 0.0], (r.flavour, rewards)  # targets 1, 2 | 3, 4 | 5, 6; counters 2 or 1
    for flavour in ("ours", "ours+config"):
        same_figures(runs["trl"], runs[flavour])


# -- "Multiple environments" ------------------------------------------------------------------------------------------
class CodingEnv:
    def reset(self, **kwargs) -> str:
        self.n = 10
        return f"Compute the {self.n}th Fibonacci number."

    def run_code(self, code: str) -> str:
        """
        Run Python code and return its output.

        Args:
            code: The code to run.

        Returns:
            What the code printed.
        """
        return "55" if "fib" in code else "NameError"


class GameEnv:
    def reset(self, **kwargs) -> str:
        self.position = 0
        return "Reach the goal tile."

    def move(self, action: str) -> str:
        """
        Move on the board.

        Args:
            action: One of "up", "down", "left", "right".

        Returns:
            The new position.
        """
        if action not in ("up", "down", "left", "right"):
            raise ValueError(f"Invalid action {action!r}.")
        self.position += 1
        return f"position {self.position}"


def test_multiple_environments(tmp_path):
    """A dataset of environment names only: each row's environment writes its prompt and exposes only its tools; a
    call of the other environment's tool is not found."""
    from datasets import Dataset

    seen = {}

    def reward_func(completions, environments, **kwargs):
        seen.setdefault(flavour, []).append([[m["content"] for m in c if m["role"] == "tool"] for c in completions])
        return [float(getattr(e, "position", 0)) for e in environments]

    dataset = Dataset.from_dict({"environment": ["coding", "game"] * 8})
    first = [call("run_code", code="print(fib(10))") + "<|im_end|>", call("move", action="up") + "<|im_end|>",
             call("move", action="up") + "<|im_end|>", call("move", action="sideways") + "<|im_end|>"]
    script = by_turn(first, ["Done.<|im_end|>"] * 4)
    config = dict(per_device_train_batch_size=4, num_generations=2, max_completion_length=128, max_steps=2,
                  shuffle_dataset=False, **QWEN3)
    runs = {}
    for flavour in FLAVOURS:
        runs[flavour] = r = run(flavour, tmp_path, script, model=policy("qwen3"), config=config,
                                reward_funcs=reward_func, train_dataset=dataset,
                                environment_factory={"coding": CodingEnv, "game": GameEnv})
        assert r.error is None, (flavour, r.error)
    expected = [["55"], [str({"error": "Tool move not found."})], ["position 1"],
                [str({"error": "Invalid action 'sideways'."})]]
    assert all(batches == [expected] * 2 for batches in seen.values()), seen
    for flavour in ("ours", "ours+config"):
        same_figures(runs["trl"], runs[flavour])


# -- examples/scripts/grpo_agent.py: SQL on sqlite, its own signal.alarm timeout ------------------------------------
@contextmanager
def timeout(seconds: int):
    def expired(signum, frame):
        raise TimeoutError(f"Operation timed out after {seconds} seconds")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_sql_agent_with_its_own_alarm_timeout(tmp_path):
    """TRL's grpo_agent.py pattern: a read-only sqlite query under signal.alarm, returning the rows (a list, kept as
    the tool message's content). signal.alarm works only on the main thread: TRL runs sync tools there, and so do we
    by default."""
    database = tmp_path / "interactions.db"
    with sqlite3.connect(database) as db:
        db.execute("create table interactions (gene_a text, gene_b text)")
        db.executemany("insert into interactions values (?, ?)", [("TP53", "MDM2"), ("BRCA1", "BARD1")])

    def query_interactions(sql_command: str) -> list[tuple]:
        """
        Execute a read-only SQL command on the interactions database.

        Args:
            sql_command: The SQL command to execute.

        Returns:
            A list of tuples containing the query results.
        """
        with timeout(5):
            with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as conn:
                return conn.execute(sql_command).fetchall()

    seen = {}

    def correctness_reward(completions, **kwargs):
        seen[flavour] = [[m["content"] for m in c if m["role"] == "tool"] for c in completions]
        return [float("*yes*" in c[-1]["content"]) for c in completions]

    sql = "SELECT gene_b FROM interactions WHERE gene_a = 'TP53'"
    first = [call("query_interactions", sql_command=sql) + "<|im_end|>",
             call("query_interactions", sql_command="DROP TABLE interactions") + "<|im_end|>", "*no*<|im_end|>"]
    script = by_rows(first, ["*yes*<|im_end|>", "*no*<|im_end|>"])
    config = dict(per_device_train_batch_size=3, num_generations=3, max_completion_length=512, max_steps=1)
    runs = {}
    for flavour in FLAVOURS:
        runs[flavour] = r = run(flavour, tmp_path, script, config=config, reward_funcs=correctness_reward,
                                train_dataset=zen(), tools=[query_interactions])
        assert r.error is None, (flavour, r.error)
    expected = [[[("MDM2",)]], [str({"error": "attempt to write a readonly database"})], []]
    assert all(messages == expected for messages in seen.values()), seen
    for flavour in ("ours", "ours+config"):
        same_figures(runs["trl"], runs[flavour])


# -- examples/scripts/grpo_2048.py: a game whose move raises once it is over ---------------------------------------
class Game:
    def reset(self, **kwargs) -> str:
        self.score, self.moves = 0, 0
        return f"score={self.score}"

    def move(self, direction: str) -> str:
        """
        Play one move.

        Args:
            direction: One of "up", "down", "left", "right".

        Returns:
            The new score.
        """
        if self.moves >= 1:
            raise ValueError("Game over.")
        self.moves += 1
        self.score += {"up": 4, "down": 2}.get(direction, 0)
        return f"score={self.score}"


def test_game_whose_move_raises_when_over(tmp_path):
    def reward_score(environments, **kwargs):
        return [float(env.score) for env in environments]

    turns = {0: [call("move", direction="up") + "<|im_end|>", call("move", direction="down") + "<|im_end|>"],
             1: [call("move", direction="left") + "<|im_end|>"] * 2, 2: ["Stop.<|im_end|>"] * 2}
    config = dict(per_device_train_batch_size=2, num_generations=2, max_completion_length=256, max_steps=2)
    runs = {}
    for flavour in FLAVOURS:
        runs[flavour] = r = run(flavour, tmp_path, lambda i, rows: turns[i % 3], config=config,
                                reward_funcs=reward_score, train_dataset=zen(), environment_factory=Game)
        assert r.error is None, (flavour, r.error)
        assert r.last("tools/failure_frequency") == 0.5 and r.last("reward") == 3.0, flavour  # the 2nd move: over
    for flavour in ("ours", "ours+config"):
        same_figures(runs["trl"], runs[flavour])
