"""Realistic training scripts (benchmarks/realworld/): diagnosis, `fix` and the hand fix.

    python benchmarks/realworld.py --device cuda                 # every script, 5m fix budget
    python benchmarks/realworld.py --quick --device cpu --only deep_mlp   # CPU smoke run
    python benchmarks/realworld.py --json rows.json --out runs/realworld

For each script: (a) ``torchtriage run --steps N`` and the diagnosed primary layer, (b)
``torchtriage fix`` within ``--budget``, (c) the hand-written fix (the script's ``--fixed``) as
``torchtriage ab --candidate``. Prints one row per script: expected and diagnosed layer, what
``fix`` kept, its speedup [95% CI], the hand fix's speedup [95% CI], and the share of the hand
fix's gain that ``fix`` found: (fix - 1) / (hand - 1), clipped to 0-200 %, "-" when the hand
fix gained nothing (< 2 %, or its A/B verdict is not faster). The out-of-memory script's
baseline never completes, so its row compares throughput instead: fix's final steps/s over
the hand fix's steps/s. No asserts.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent / "realworld"
REPO = HERE.parents[1]
MIN_GAIN = 0.02  # hand speedups below 1 + this leave the share undefined

# name -> (file, expected steady-state layer, steps flag)
SCRIPTS = {
    "text_classifier": ("text_classifier.py", "data_loading", "--steps"),
    "imagenet_resnet": ("imagenet_resnet.py", "data_loading", "--steps"),
    "nanogpt_memmap": ("nanogpt_memmap.py", "kernel", "--max-iters"),
    "oom_decoder": ("oom_decoder.py", "memory", "--steps"),
    "vit_fp32": ("vit_fp32.py", "kernel", "--steps"),
    "deep_mlp": ("deep_mlp.py", "host", "--steps"),
}
# Sizes: on CUDA the scripts' defaults; on CPU smaller models; --quick: tiny (as in the test).
CPU_ARGS = {
    "text_classifier": "--num-samples 4000 --dim 64 --layers 2 --batch-size 32",
    "imagenet_resnet": "-b 32 -j 4 --image-size 128 --crop 112 --width 16 --num-classes 100",
    "nanogpt_memmap": "--batch-size 8 --block-size 128 --n-layer 2 --n-head 4 --n-embd 128 "
                      "--vocab-size 4096 --num-tokens 2000000",
    "oom_decoder": "--batch-size 32 --seq-len 64 --dim 128 --layers 2 --heads 4 --vocab 2048 "
                   "--simulate-capacity 62914560",
    "vit_fp32": "--batch-size 32 --image-size 64 --patch 8 --dim 128 --depth 4 --heads 4 "
                "--num-classes 100",
    "deep_mlp": "",
}
# On CUDA: the out-of-memory script plays a 24 GiB card (0.9 B parameters load in seconds;
# sized to the whole H200 it has 4.3 B and each process takes over 100 s to start).
CUDA_ARGS = {"oom_decoder": "--capacity-gib 24"}
QUICK_ARGS = {
    "text_classifier": "--num-samples 300 --dim 32 --layers 1 --batch-size 8 --merges 30",
    "imagenet_resnet": "-b 4 -j 1 --image-size 40 --crop 32 --width 8 --num-classes 10",
    "nanogpt_memmap": "--batch-size 2 --block-size 32 --n-layer 2 --n-head 2 --n-embd 32 "
                      "--vocab-size 256 --num-tokens 20000",
    "oom_decoder": "--batch-size 16 --seq-len 32 --dim 64 --layers 2 --heads 4 --vocab 512 "
                   "--simulate-capacity 7340032",
    "vit_fp32": "--batch-size 4 --image-size 32 --patch 8 --dim 32 --depth 2 --heads 4 "
                "--num-classes 10",
    "deep_mlp": "--depth 8 --width 32",
}


def command(name: str, device: str, quick: bool, fixed: bool = False) -> list[str]:
    file, _, steps_flag = SCRIPTS[name]
    sizes = (QUICK_ARGS if quick else CPU_ARGS if device == "cpu" else CUDA_ARGS).get(name, "")
    if device != "cpu":  # --simulate-capacity is the CPU stand-in for a real device
        sizes = sizes.split("--simulate-capacity")[0]
    return [sys.executable, str(HERE / file), "--device", device, steps_flag, "100000",
            *shlex.split(sizes), *(["--fixed"] if fixed else [])]


def torchtriage(args: list[str], log: Path) -> int:
    full = [sys.executable, "-m", "torchtriage", *args]
    with log.open("w") as f:
        f.write(shlex.join(full) + "\n")
        f.flush()
        return subprocess.run(full, stdout=f, stderr=subprocess.STDOUT).returncode


def read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def error_line(log: Path) -> str:
    lines = [ln for ln in log.read_text().splitlines() if "error" in ln.lower()]
    return lines[-1].strip()[:160] if lines else ""


def bench(name: str, args, out: Path) -> dict:
    base = command(name, args.device, args.quick)
    hand = command(name, args.device, args.quick, fixed=True)
    store = ["--store", str(out / "runs.sqlite")]
    row: dict = {"script": name, "expected": SCRIPTS[name][1], "command": base,
                 "hand_command": hand}
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rc = torchtriage(["run", "--out", str(d / "run"), "--stop-after-window", "--timeout",
                      str(args.run_timeout), *store, "--", *base], d / "run.log")
    diag = read(d / "run" / "diagnosis.json")
    row["diagnosed"] = diag.get("primary")
    window = diag.get("window") or {}
    row["window"] = (f"{window.get('first_step')}-{window.get('last_step')}"
                     if window else None)
    row["representative"] = window.get("representative")
    row["median_step_ms"] = (diag.get("breakdown") or {}).get("median_step_ms")
    row["run_rc"], row["run_error"] = rc, "" if rc == 0 else error_line(d / "run.log")
    if args.classify_only:
        row["seconds"] = round(time.perf_counter() - started, 1)
        return row
    rc = torchtriage(["fix", "--out", str(d / "fix"), "--budget", args.budget, "--trials",
                      str(args.trials), "--steps", str(args.steps), *store, "--", *base],
                     d / "fix.log")
    fix = read(d / "fix" / "fix.json")
    row["fix_rc"], row["fix_error"] = rc, "" if rc == 0 else error_line(d / "fix.log")
    row["fix_kept"] = [f"{k['knob']}={k['value']}" for k in fix.get("kept", [])]
    for key in ("speedup", "ci_low", "ci_high", "verdict", "original_steps_per_s",
                "final_steps_per_s", "stopped_because"):
        row[f"fix_{key}"] = fix.get(key)
    row["fix_rounds"] = [r.get("primary") for r in fix.get("rounds", [])]
    rc = torchtriage(["ab", "--out", str(d / "ab"), "--trials",
                      str(args.hand_trials or args.trials), "--steps",
                      str(args.steps), "--candidate", shlex.join(hand), *store, "--", *base],
                     d / "ab.log")
    ab = read(d / "ab" / "ab.json")
    row["ab_rc"], row["ab_error"] = rc, "" if rc == 0 else error_line(d / "ab.log")
    for key in ("speedup", "ci_low", "ci_high", "verdict"):
        row[f"hand_{key}"] = ab.get(key)
    cand = ab.get("b") or {}
    row["hand_steps_per_s"] = cand.get("steps_per_s")
    row["hand_completes"] = bool(cand.get("trials_ok"))
    row["share"] = share(row)
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def share(row: dict) -> float | None:
    """Percent of the hand fix's gain that `fix` found (throughput ratio for the OOM script)."""
    if row["expected"] == "memory":
        fix_sps, hand_sps = row.get("fix_final_steps_per_s"), row.get("hand_steps_per_s")
        if not fix_sps or not hand_sps or not row["fix_kept"]:
            return 0.0 if hand_sps else None
        return min(200.0, 100.0 * fix_sps / hand_sps)
    fix, hand = row.get("fix_speedup"), row.get("hand_speedup")
    if hand is None or hand < 1 + MIN_GAIN or row.get("hand_verdict") != "faster":
        return None
    gain = (fix - 1) if fix is not None and row["fix_kept"] else 0.0
    return max(0.0, min(200.0, 100.0 * gain / (hand - 1)))


def ci(value, low, high) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" + (f" [{low:.2f}-{high:.2f}]" if low is not None else "")


def print_classification(rows: list[dict]) -> None:
    print("| script | expected | diagnosed at steady state | window | representative | "
          "median step ms | s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        diagnosed = r["diagnosed"] or f"- (run exit {r['run_rc']})"
        step = f"{r['median_step_ms']:.1f}" if r.get("median_step_ms") else "-"
        print(f"| {r['script']} | {r['expected']} | {diagnosed} | {r.get('window') or '-'} | "
              f"{r.get('representative')} | {step} | {r['seconds']:.0f} |", flush=True)
    for r in rows:
        if r["run_error"]:
            print(f"{r['script']}: torchtriage run exit {r['run_rc']}: {r['run_error']}")


def print_table(rows: list[dict]) -> None:
    print("| script | expected | diagnosed | fix kept | fix speedup [CI] | hand speedup [CI] "
          "| share | s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        kept = ", ".join(r["fix_kept"]) or "nothing"
        diagnosed = r["diagnosed"] or f"- (run exit {r['run_rc']})"
        if r["expected"] == "memory":
            fsps, hsps = r.get("fix_final_steps_per_s"), r.get("hand_steps_per_s")
            fix_col = (f"completes, {fsps:.2f} steps/s" if fsps and r["fix_kept"]
                       else "does not complete")
            hand_col = (f"completes, {hsps:.2f} steps/s" if r["hand_completes"] and hsps
                        else "does not complete")
        else:
            fix_col = ci(r["fix_speedup"], r["fix_ci_low"], r["fix_ci_high"])
            hand_col = ci(r["hand_speedup"], r["hand_ci_low"], r["hand_ci_high"])
            if r.get("hand_verdict"):
                hand_col += f" {r['hand_verdict']}"
        pct = "-" if r["share"] is None else f"{r['share']:.0f}%"
        print(f"| {r['script']} | {r['expected']} | {diagnosed} | {kept} | {fix_col} | "
              f"{hand_col} | {pct} | {r['seconds']:.0f} |", flush=True)
    for r in rows:
        for what in ("run", "fix", "ab"):
            if r[f"{what}_error"]:
                print(f"{r['script']}: torchtriage {what} exit {r[f'{what}_rc']}: "
                      f"{r[f'{what}_error']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="passed to the scripts")
    parser.add_argument("--budget", default=None, help="fix budget (default 5m, quick 2m)")
    parser.add_argument("--only", choices=sorted(SCRIPTS), action="append",
                        help="run this script only (repeatable)")
    parser.add_argument("--out", type=Path, default=None,
                        help="keep every run, fix and A/B here (default: a temporary dir)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a CPU smoke run")
    parser.add_argument("--trials", type=int, default=None, help="trials per arm (3; quick 2)")
    parser.add_argument("--hand-trials", type=int, default=None,
                        help="trials per arm of the hand fix's A/B (default: --trials); fewer "
                             "when its candidate compiles for a minute per trial")
    parser.add_argument("--steps", type=int, default=None,
                        help="measured steps per trial (10; quick 3)")
    parser.add_argument("--run-timeout", type=int, default=300,
                        help="seconds for `torchtriage run --stop-after-window`")
    parser.add_argument("--classify-only", action="store_true",
                        help="only `run`: the diagnosed layer at steady state, no fix or A/B")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE",
                        help="also write the rows as JSON")
    args = parser.parse_args()
    args.budget = args.budget or ("2m" if args.quick else "5m")
    args.trials = args.trials or (2 if args.quick else 3)
    args.steps = args.steps or (3 if args.quick else 10)
    names = args.only or list(SCRIPTS)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        for name in names:
            what = "run" if args.classify_only else f"run, fix (budget {args.budget}), hand A/B"
            print(f"{name}: {what} ...", file=sys.stderr, flush=True)
            rows.append(bench(name, args, out))
    (print_classification if args.classify_only else print_table)(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
