"""Make kept fixes permanent: a patch for the user's source where a knob is one argument or one
statement, and the exact lines to add where it is not.

Each knob's recipe comes from the knob registry (:mod:`torchtriage.diagnosis.knobs`). ``call``
knobs record the ``file:line`` of the call they changed (``DataLoader(...)``, the optimizer's
constructor, ``DistributedDataParallel(...)``); the call is found again with :mod:`ast` and its
keyword argument set or added. ``statements`` (backend flags) go after the entry script's last
top-level import. ``by_hand`` knobs (autocast, torch.compile, checkpointing, comm hooks) are a
change of structure that a patch would guess at, so they are given as instructions.
"""

from __future__ import annotations

import ast
import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchtriage.diagnosis import knobs as registry
from torchtriage.results.run import KnobOutcome


@dataclass
class Patch:
    diff: str = ""  # unified diff, paths relative to the working directory (git apply / patch -p1)
    files: list[str] = field(default_factory=list)
    instructions: list[str] = field(default_factory=list)  # what the diff could not say


def make_patch(kept: dict[str, Any], outcomes: dict[str, KnobOutcome],
               command: list[str], cwd: Path | None = None) -> Patch:
    """The patch for ``kept`` knobs, from the knob outcomes the trials recorded."""
    cwd = (cwd or Path.cwd()).resolve()
    edits: dict[Path, list[tuple[int, str, Any, tuple[str, ...] | None, str]]] = {}
    patch = Patch()
    statements: list[str] = []
    table = registry.by_id()
    for knob, value in kept.items():
        outcome = outcomes.get(knob)
        recipe = table[knob].recipe if knob in table else None
        if recipe is not None and recipe.how == "call":
            keyword = table[knob].keyword
            callees = recipe.callees or None
            if callees is None:  # the optimizer class named in the detail, "SGD(fused=True)..."
                callees = ((outcome.detail if outcome else "").split("(", 1)[0],)
            sites = outcome.where if outcome else []
            if not sites:
                patch.instructions.append(f"{knob}={value!r}: set `{keyword}={value!r}` where "
                                          "it is constructed (no call site was recorded)")
            for site in sites:
                path, _, line = site.rpartition(":")
                edits.setdefault(Path(path), []).append((int(line), keyword, value, callees,
                                                         knob))
        elif recipe is not None and recipe.how == "statements":
            statements.extend(s.format(v=value) for s in recipe.lines)
        elif recipe is not None:
            mode = "" if value in ("default", True) else f", mode={value!r}"
            patch.instructions.append(f"{knob}={value!r}: " + recipe.lines[0].format(
                mode=mode, value=value))
        else:
            patch.instructions.append(f"{knob}={value!r}")
    entry = _entry_script(command, cwd)
    if statements:
        if entry is None:
            patch.instructions.append("after `import torch`: " + "; ".join(statements))
        else:
            edits.setdefault(entry, [])
    diffs = []
    for path in sorted(edits):
        try:
            old = path.read_text()
        except OSError:
            patch.instructions.append(f"{path}: cannot read it to patch")
            continue
        new, notes = _edit_calls(old, edits[path])
        patch.instructions.extend(f"{path}: {n}" for n in notes)
        if path == entry and statements:
            new = _insert_statements(new, statements)
        if new != old:
            rel = os.path.relpath(path, cwd)
            diffs.append("".join(difflib.unified_diff(
                old.splitlines(keepends=True), new.splitlines(keepends=True),
                fromfile=f"a/{rel}", tofile=f"b/{rel}")))
            patch.files.append(rel)
    patch.diff = "".join(diffs)
    return patch


def _entry_script(command: list[str], cwd: Path) -> Path | None:
    for arg in command:
        if arg.endswith(".py"):
            p = Path(arg)
            return (p if p.is_absolute() else cwd / p).resolve()
    return None


def _offsets(text: str) -> list[int]:
    starts, total = [], 0
    for line in text.splitlines(keepends=True):
        starts.append(total)
        total += len(line)
    starts.append(total)
    return starts


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _edit_calls(text: str, wanted: list[tuple[int, str, Any, tuple[str, ...] | None, str]]
                ) -> tuple[str, list[str]]:
    """Set keyword arguments of the calls at the given lines; notes for what was not found."""
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        return text, [f"not Python ({exc.msg}); set the arguments by hand"]
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    line_start = _offsets(text)

    def pos(line: int, col: int) -> int:
        # ast columns are UTF-8 byte offsets
        raw = text[line_start[line - 1]:line_start[line]].encode()
        return line_start[line - 1] + len(raw[:col].decode(errors="replace"))

    replacements: list[tuple[int, int, str]] = []
    notes = []
    for line, keyword, value, callees, knob in wanted:
        spanning = [c for c in calls if c.lineno <= line <= (c.end_lineno or c.lineno)
                    and _name(c.func) in (callees or ())]
        if not spanning:
            notes.append(f"line {line}: no {'/'.join(callees or ('?',))}(...) call found for "
                         f"{knob}; set `{keyword}={value!r}` by hand")
            continue
        call = min(spanning, key=lambda c: (c.end_lineno or c.lineno) - c.lineno)
        literal = repr(value)
        existing = next((k for k in call.keywords if k.arg == keyword), None)
        if existing is not None:
            v = existing.value
            replacements.append((pos(v.lineno, v.col_offset),
                                 pos(v.end_lineno or v.lineno, v.end_col_offset or 0), literal))
            continue
        close = pos(call.end_lineno or call.lineno, (call.end_col_offset or 1) - 1)
        before = text[:close].rstrip()
        has_args = bool(call.args or call.keywords)
        sep = "" if not has_args else (" " if before.endswith(",") else ", ")
        replacements.append((close, close, f"{sep}{keyword}={literal}"))
    for start, end, new in sorted(set(replacements), reverse=True):
        text = text[:start] + new + text[end:]
    return text, notes


def _insert_statements(text: str, statements: list[str]) -> str:
    """Insert statements after the last top-level import (needs ``import torch`` there)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    lines = text.splitlines(keepends=True)
    at = (imports[-1].end_lineno or 0) if imports else 0
    block = ["\n", "# torchtriage fix: kept after a verified A/B\n",
             *(s + "\n" for s in statements)]
    return "".join(lines[:at] + block + lines[at:])
