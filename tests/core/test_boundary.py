"""The TRL boundary holds: no module of trl_agentic but trl_agentic/compat.py touches a private name of TRL's
GRPOTrainer or transformers' Trainer, or imports from TRL's internal modules."""

import io
import re
import tokenize
from pathlib import Path

import transformers
import trl

PACKAGE = Path(__file__).resolve().parents[2] / "trl_agentic"
BOUNDARY = PACKAGE / "compat.py"


def _private_names(source: str) -> set[str]:
    return set(re.findall(r"\b(?:self|trainer)\.(_[A-Za-z]\w*)", source)) | set(
        re.findall(r"^\s+def (_[A-Za-z]\w*)\(", source, re.MULTILINE)
    )


def _trl_private_names() -> set[str]:
    trl_trainer = Path(trl.__file__).parent / "trainer" / "grpo_trainer.py"
    hf_trainer = Path(transformers.__file__).parent / "trainer.py"
    names = _private_names(trl_trainer.read_text()) | _private_names(hf_trainer.read_text())
    return {n for n in names if not n.startswith("__")}


def _code_only(source: str) -> str:
    """``source`` with strings and comments blanked (a docstring may name a private method; only code counts)."""
    lines = source.splitlines(keepends=True)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.STRING, tokenize.COMMENT):
            (r0, c0), (r1, c1) = token.start, token.end
            for r in range(r0, r1 + 1):
                line = lines[r - 1]
                start, end = (c0 if r == r0 else 0), (c1 if r == r1 else len(line.rstrip("\n")))
                lines[r - 1] = line[:start] + " " * (end - start) + line[end:]
    return "".join(lines)


def _ours() -> dict[Path, str]:
    return {p: _code_only(p.read_text()) for p in PACKAGE.rglob("*.py")}


def offenders(sources: dict[Path, str]) -> list[str]:
    """Uses of a TRL private name, or imports from TRL's internal modules, outside the boundary."""
    defined_by_us = set()
    for source in sources.values():  # our own private names (e.g. the engine's helpers) are not TRL's
        defined_by_us |= set(re.findall(r"def (_[A-Za-z]\w*)\(", source))
        defined_by_us |= set(re.findall(r"self\.(_[A-Za-z]\w*)\s*(?::[^=]*)?=", source))
    boundary_names = _private_names(sources.get(BOUNDARY, ""))
    trl_private = _trl_private_names() - {n for n in defined_by_us if n not in boundary_names}
    found = []
    for path, source in sources.items():
        if path == BOUNDARY:
            continue
        where = path.relative_to(PACKAGE.parent) if PACKAGE.parent in path.parents else path
        for name in sorted(trl_private):
            for match in re.finditer(rf"\.{re.escape(name)}\b", source):
                found.append(f"{where}:{source.count(chr(10), 0, match.start()) + 1}: .{name}")
        for match in re.finditer(r"^\s*(?:from trl\.(?!__)[\w.]+ import|import trl\.)", source, re.MULTILINE):
            found.append(f"{where}:{source.count(chr(10), 0, match.start()) + 1}: {match.group(0).strip()}")
    return found


def test_no_trl_private_name_outside_the_boundary():
    found = offenders(_ours())
    assert found == [], "TRL internals used outside trl_agentic/compat.py:\n" + "\n".join(found)


def test_the_check_can_fail():
    sources = _ours()
    sources[PACKAGE / "fake.py"] = _code_only(
        'from trl.trainer.utils import nanstd\n"""self._metrics in a docstring is fine"""\n'
        "def f(trainer):\n    return trainer._metrics, trainer.args\n"
    )
    assert offenders(sources) == ["trl_agentic/fake.py:4: ._metrics", "trl_agentic/fake.py:1: from trl.trainer.utils import"]
