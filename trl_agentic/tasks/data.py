"""Loading a task's rows: a hub dataset id, or local data (a file or a folder), with one-line errors.

``load_rows("openai/gsm8k", "main", "test")`` reads the hub; ``load_rows("data/gsm8k", split="test")`` reads
``data/gsm8k/test.jsonl`` (or ``.json`` / ``.parquet``, or a folder written by ``Dataset.save_to_disk``);
``load_rows("questions.parquet")`` reads one file whatever the split. Anything that cannot be loaded raises
:class:`TaskConfigError` with one sentence that names the option to change (``flag``), never a traceback from deep
inside ``datasets``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import TaskConfigError

_FILE_KINDS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}



def _read_jsonl(path: Path, flag: str) -> Any:
    from datasets import Dataset

    rows = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise TaskConfigError(f"{flag} {path}: line {number} is not valid JSON ({exc.msg})") from None
    if not rows:
        raise TaskConfigError(f"{flag} {path}: the file holds no rows")
    return Dataset.from_list(rows)


def _load_file(path: Path, flag: str) -> Any:
    suffix = path.suffix.lower()
    if suffix not in _FILE_KINDS:
        raise TaskConfigError(f"{flag} {path}: unsupported file type {suffix!r}; use .jsonl, .json, .parquet or .csv")
    if suffix == ".jsonl" or (suffix == ".json" and path.read_text(encoding="utf-8").lstrip()[:1] == "{"):
        return _read_jsonl(path, flag)
    from datasets import load_dataset

    return load_dataset(_FILE_KINDS[suffix], data_files=str(path), split="train")


def _load_folder(path: Path, split: str, flag: str, split_flag: str) -> Any:
    if (path / "dataset_dict.json").exists() or (path / "dataset_info.json").exists():
        from datasets import DatasetDict, load_from_disk

        data = load_from_disk(str(path))
        if isinstance(data, DatasetDict):
            if split not in data:
                raise TaskConfigError(f"{flag} {path} has the splits {list(data)}, not {split!r}: pass {split_flag}")
            data = data[split]
        return data
    for suffix in (".jsonl", ".json", ".parquet"):
        candidate = path / f"{split}{suffix}"
        if candidate.exists():
            return _load_file(candidate, flag)
    found = sorted(p.name for p in path.iterdir() if p.suffix in _FILE_KINDS)
    raise TaskConfigError(f"{flag} {path} holds no {split}.jsonl, {split}.json or {split}.parquet (found {found}): "
                          f"pass {split_flag} with one of them")


def is_local(name_or_path: str) -> bool:
    """Whether ``name_or_path`` names local data rather than a hub id (an existing path, or one that looks like a
    file: a known suffix, or a leading ``.``, ``/`` or ``~``)."""
    path = Path(name_or_path).expanduser()
    return path.exists() or path.suffix.lower() in _FILE_KINDS or name_or_path.startswith((".", "/", "~"))


def load_rows(
    name_or_path: str | None,
    config: str | None = None,
    split: str = "train",
    *,
    flag: str = "--dataset_name",
    split_flag: str = "--dataset_train_split",
) -> Any:
    """A ``datasets.Dataset``: a hub dataset (``name_or_path`` an id such as ``openai/gsm8k``) or local data.

    Args:
        name_or_path: Hub id, a ``.jsonl``/``.json``/``.parquet``/``.csv`` file, or a folder holding
            ``<split>.jsonl`` (``.json``, ``.parquet``) or written by ``save_to_disk``.
        config: Hub dataset configuration (``"main"`` for GSM8K).
        split: Split to read (ignored for a single file).
        flag, split_flag: Option names quoted in error messages.
    """
    if not name_or_path:
        raise TaskConfigError(f"no dataset: pass {flag} with a hub id or a local .jsonl/.parquet file or folder")
    if is_local(name_or_path):
        path = Path(name_or_path).expanduser()
        if path.is_file():
            return _load_file(path, flag)
        if path.is_dir():
            return _load_folder(path, split, flag, split_flag)
        raise TaskConfigError(f"{flag} {name_or_path} does not exist: pass a hub id or an existing file or folder")
    from datasets import load_dataset

    from ..hub import check_hub_dataset

    check_hub_dataset(name_or_path, flag)  # no network: one line now, not after a minute of retries
    try:
        return load_dataset(name_or_path, config, split=split)
    except Exception as exc:  # noqa: BLE001 - offline, unknown id, unknown split: one line, the fix first
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TaskConfigError(
            f"could not load the dataset {name_or_path!r}"
            f"{f' ({config})' if config else ''} split {split!r} ({type(exc).__name__}: {reason[:200]}); offline? "
            f"pass {flag} with a local .jsonl/.parquet file or folder"
        ) from None


def take(dataset: Any, n: int | None) -> Any:
    """The first ``n`` rows (all of them when ``n`` is None)."""
    return dataset if n is None else dataset.select(range(min(n, len(dataset))))


def require_columns(dataset: Any, columns: list[str], task: str, flag: str = "--dataset_name") -> None:
    """One-line error when the rows lack a column the task reads."""
    missing = [c for c in columns if c not in dataset.column_names]
    if missing:
        raise TaskConfigError(f"{task} rows need the column(s) {missing}; the data given by {flag} has "
                              f"{dataset.column_names}")
