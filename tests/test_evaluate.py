"""trl_agentic.evaluate: the pass@k estimator, and evaluation through the engine with a TRL reward function."""

import itertools
import math

import pytest
from helpers import even_rows_right

from trl_agentic.evaluate import evaluate, pass_at_k
from trl_agentic.toy import LookupEnvironment, lookup_reward, make_lookup_dataset


@pytest.mark.parametrize("n,c,k", [(5, 0, 1), (5, 2, 1), (5, 2, 3), (6, 5, 2), (4, 4, 4), (10, 3, 5)])
def test_pass_at_k_equals_the_subset_probability(n, c, k):
    """pass@k is the probability that a random k-subset of the n samples holds a success."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    expected = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert math.isclose(pass_at_k(n, c, k), expected)
    with pytest.raises(ValueError):
        pass_at_k(n, c, n + 1)


def test_evaluate_counts_successes_per_row(tokenizer):
    rows = make_lookup_dataset(6, seed=1)
    report, trajectories = evaluate(None, tokenizer, LookupEnvironment, rows, lookup_reward, samples_per_row=2,
                                    k=(1, 2), generator=even_rows_right(tokenizer, rows), batch_size=5,
                                    max_turns=3, max_completion_length=60, show_progress=False)
    assert len(trajectories) == 12
    assert report.successes == [2, 0, 2, 0, 2, 0]
    assert report.accuracy == 0.5 and report.pass_at_k == {1: 0.5, 2: 0.5}
    assert report.mean_turns == 2 and report.mean_tool_calls == 1 and report.truncation_rate == 0
    assert "accuracy 0.500" in report.summary() and report.to_dict()["pass_at_k"]["2"] == 0.5


def test_a_failed_environment_is_unscorable_as_in_training(tokenizer, caplog):
    """Issue 53: training marks a run whose environment failed as unscorable; evaluation now does too (a reward
    function that scored it anyway, here a constant, no longer counts it as a success), named in one line."""
    import logging

    class FailsOnOddRows(LookupEnvironment):
        def reset(self, **row):
            if row["index"] % 2:
                raise RuntimeError(f"no slot for row {row['index']}")
            return super().reset(**row)

    rows = [dict(row, index=i) for i, row in enumerate(make_lookup_dataset(4, seed=1))]
    with caplog.at_level(logging.WARNING, logger="trl_agentic.evaluate"):
        report, trajectories = evaluate(None, tokenizer, FailsOnOddRows, rows, lambda completions, **k: [1.0] * 4,
                                        generator=even_rows_right(tokenizer, rows), max_turns=3,
                                        max_completion_length=60, show_progress=False)
    assert [t.stop_reason == "env_error" for t in trajectories] == [False, True, False, True]
    assert report.rewards == [1.0, None, 1.0, None] and report.successes == [1, 0, 1, 0] and report.accuracy == 0.5
    assert report.env_failure_rate == 0.5
    assert [r.getMessage() for r in caplog.records] == [
        "evaluation: 2 of 4 trajectories failed and count as failures (env_error 2); e.g. FailsOnOddRows.reset raised "
        "RuntimeError: no slot for row 1"]


def test_a_reward_warning_is_written_above_the_progress_bar_not_on_its_line(tokenizer, capfd):
    """Issue 58: a reward warning was printed after the progress bar's text, on its line."""
    rows = make_lookup_dataset(4, seed=1)

    def nan_reward(completions, **kwargs):
        return [float("nan")] * len(completions)

    evaluate(None, tokenizer, LookupEnvironment, rows, nan_reward, generator=even_rows_right(tokenizer, rows),
             batch_size=2, max_turns=3, max_completion_length=60, show_progress=True)
    lines = [line.split("\r")[-1] for line in capfd.readouterr().err.split("\n") if "nan_reward" in line]
    assert len(lines) == 2 and all(line.startswith("reward function 'nan_reward' returned 2 of 2") for line in lines)
