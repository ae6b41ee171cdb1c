"""Make kept fixes permanent: a patch for the user's source where a knob is one argument or one
statement, and the exact lines to add where it is not.

Each knob's recipe comes from the knob registry (:mod:`torchtriage.diagnosis.knobs`). ``call``
knobs record the ``file:line`` of the call they changed (``DataLoader(...)``, the optimizer's
constructor, ``DistributedDataParallel(...)``); the call is found again with :mod:`ast` and its
keyword argument set or added. ``statements`` (backend flags) go after the entry script's last
top-level import. A call whose argument is the script's own (``num_workers=args.workers``, a
variable, a parameter) keeps it: the value is set at its source (the flag's ``default=``, the
assignment, the parameter's default; see :func:`_source`) so that the script's flag still
works, or the instructions say where to set it. ``by_hand`` knobs (autocast, torch.compile,
checkpointing, comm hooks) are a change of structure that a patch would guess at, so they are
given as instructions.
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
        if existing is not None and not isinstance(existing.value, ast.Constant):
            # the script passes its own value (a flag, a variable): set it at its source
            target, note = _source(tree, existing.value, call, keyword, value)
            notes.append(note)
            if target is not None:
                node, owner = target
                if node is None:  # add default= to an add_argument(...) without one
                    close = pos(owner.end_lineno or owner.lineno,
                                (owner.end_col_offset or 1) - 1)
                    sep = " " if text[:close].rstrip().endswith(",") else ", "
                    replacements.append((close, close, f"{sep}default={literal}"))
                else:
                    replacements.append((pos(node.lineno, node.col_offset),
                                         pos(node.end_lineno or node.lineno,
                                             node.end_col_offset or 0), literal))
            continue
        if existing is not None:
            v = existing.value
            replacements.append((pos(v.lineno, v.col_offset),
                                 pos(v.end_lineno or v.lineno, v.end_col_offset or 0), literal))
            continue
        if any(k.arg is None for k in call.keywords):  # DataLoader(ds, **options)
            notes.append(f"line {call.lineno}: the call takes **keyword arguments, which may "
                         f"hold {keyword}; set `{keyword}={literal}` where they are built")
            continue
        close = pos(call.end_lineno or call.lineno, (call.end_col_offset or 1) - 1)
        before = text[:close].rstrip()
        has_args = bool(call.args or call.keywords)
        sep = "" if not has_args else (" " if before.endswith(",") else ", ")
        replacements.append((close, close, f"{sep}{keyword}={literal}"))
    for start, end, new in sorted(set(replacements), reverse=True):
        text = text[:start] + new + text[end:]
    return text, notes


def _flag_dest(call: ast.Call) -> str | None:
    """The attribute an ``add_argument(...)`` call stores into: ``dest=``, else its first long
    option (``--num-workers`` -> ``num_workers``), else its first option or positional name."""
    dest = next((k.value for k in call.keywords if k.arg == "dest"), None)
    if isinstance(dest, ast.Constant) and isinstance(dest.value, str):
        return dest.value
    names = [a.value for a in call.args if isinstance(a, ast.Constant)
             and isinstance(a.value, str)]
    if not names:
        return None
    long = next((n for n in names if n.startswith("--")), names[0])
    return long.lstrip("-").replace("-", "_")


def _source(tree: ast.Module, expr: ast.expr, call: ast.Call, keyword: str, value: Any
            ) -> tuple[tuple[ast.expr | None, ast.Call | ast.expr] | None, str]:
    """Where a call's argument that is not a literal gets its value, to set ``value`` there
    instead of hard-coding it into the call (which would make the script's own flag or
    setting silently ineffective afterwards).

    ``args.X`` / ``opt.X`` (an attribute) and a name ``X``: the ``add_argument`` whose
    destination is ``X``, in the same file, gets ``default=value`` (the flag still overrides
    it). A name without such a flag: its last literal assignment before the call (``X = 0``),
    else the literal default of a function parameter ``X``. Anything else is left as the script
    wrote it, with an instruction. Returns ((node to replace, or None with the add_argument
    call to add ``default=`` to), note) or (None, instruction)."""
    at = f"line {call.lineno}"
    literal = repr(value)
    source = ast.unparse(expr)
    name = expr.attr if isinstance(expr, ast.Attribute) else \
        expr.id if isinstance(expr, ast.Name) else None
    if name is None:
        return None, (f"{at}: {keyword} comes from `{source}`; set it to {literal} there "
                      "(the patch leaves it)")
    flags = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "add_argument"
             and _flag_dest(n) == name]
    if flags:
        flag = flags[-1]
        option = "/".join(a.value for a in flag.args if isinstance(a, ast.Constant))
        default = next((k.value for k in flag.keywords if k.arg == "default"), None)
        note = (f"{at}: {keyword} comes from `{source}`: set as the default of {option} "
                f"(line {flag.lineno}), so that the flag still overrides it")
        return (default, flag), note
    if isinstance(expr, ast.Name):
        assigned = [n for n in ast.walk(tree) if isinstance(n, ast.Assign)
                    and n.lineno < call.lineno and len(n.targets) == 1
                    and isinstance(n.targets[0], ast.Name) and n.targets[0].id == name
                    and isinstance(n.value, ast.Constant)]
        if assigned:
            last = max(assigned, key=lambda n: n.lineno)
            return (last.value, last), (f"{at}: {keyword} comes from `{name}`: set where it is "
                                        f"assigned (line {last.lineno})")
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if not fn.lineno <= call.lineno <= (fn.end_lineno or fn.lineno):
                continue
            a = fn.args
            positional = [*a.posonlyargs, *a.args]
            pairs = list(zip(positional[len(positional) - len(a.defaults):], a.defaults,
                             strict=True))
            pairs += [(p, d) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)
                      if d is not None]
            for param, default in pairs:
                if param.arg == name and isinstance(default, ast.Constant):
                    return (default, fn), (f"{at}: {keyword} comes from the parameter "
                                           f"`{name}` of {fn.name}(): set as its default "
                                           f"(line {default.lineno}); callers that pass it "
                                           "still override it")
    return None, (f"{at}: {keyword} comes from `{source}`; set it to {literal} where that is "
                  "set (the patch leaves it)")


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
