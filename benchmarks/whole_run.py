"""The whole-run view on user-style scripts (benchmarks/realworld/), and what recording it costs.

    python benchmarks/whole_run.py                       # every case, then the overhead table
    python benchmarks/whole_run.py --only leak --no-fix  # one case, diagnosis only
    python benchmarks/whole_run.py --overhead-only --reps 5

Cases (sizes per device below):

- ``leak``: ``leaky_lm.py`` keeps every step's logits and loss with their graph. Expected: memory
  grows steadily (bytes/step, the step at which memory is full, the out-of-memory step), cause
  ``autograd_graph_retained`` naming the list; ``fix`` keeps no memory rung.
- ``short_epochs``: ``short_epochs_spawn.py``, spawn workers started again every short epoch.
  Expected: a ``dataloader_restart`` stall every epoch with its share of the run; ``fix`` keeps
  ``dataloader.persistent_workers``.
- ``varlen``: ``compiled_varlen.py``, ``torch.compile(dynamic=False)`` fed batches padded to their
  own length. Expected: recompilations with their size guards and frames past the recompile
  limit; ``compile.dynamic`` prescribed; ``fix`` tries it.

For each case: ``torchtriage run`` over the whole run, and ``torchtriage fix`` within
``--budget``; one row of figures each. Then the overhead of recording the step timeline:
the ``--fixed`` scripts (and ``deep_mlp.py``, the fastest steps) timed under the bootstrap's
timing mode with the timeline on and off, alternating, ``--reps`` times each: the median over
runs of each run's mean step time (as an A/B trial measures it), their ratio, and the whole
process's wall time; and the recorder's own cost per step boundary, timed in this process.
No asserts.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent / "realworld"
sys.path.insert(0, str(HERE.parents[1] / "src"))
sys.path.insert(0, str(HERE.parent))
from realworld import read, torchtriage  # noqa: E402  (one way to run torchtriage and read)

CPU = "cpu"
# name -> (script, CPU arguments, CUDA arguments)
CASES = {
    "leak": ("leaky_lm.py", "--steps 300 --dim 64 --memory-limit 1GiB --log-interval 50",
             "--steps 400"),
    "short_epochs": ("short_epochs_spawn.py",
                     "--workers 2 --dataset-size 6000 --epochs 12 --epoch-steps 6 "
                     "--batch-size 32",
                     "--workers 4 --dataset-size 20000 --epochs 8 --epoch-steps 10"),
    "varlen": ("compiled_varlen.py",
               "--backend eager --steps 120 --dim 64 --layers 2 --max-len 128 --log-interval 40",
               "--steps 120 --layers 2"),
}
QUICK = {  # the test's sizes (tests/test_whole_run_scripts.py)
    "leak": "--steps 200 --dim 32 --layers 1 --vocab 2048 --seq-len 32 --memory-limit 300MiB "
            "--log-interval 50",
    "short_epochs": "--workers 1 --dataset-size 3000 --epochs 5 --epoch-steps 4 --batch-size 16 "
                    "--image-size 32 --width 8",
    "varlen": "--backend eager --steps 40 --dim 32 --layers 1 --max-len 96 --log-interval 20",
}
# the overhead table's scripts (their hand-fixed, steady form) and sizes
OVERHEAD = {
    "leaky_lm --fixed": ("leaky_lm.py", "--fixed --dim 64", "--fixed"),
    "short_epochs --fixed": ("short_epochs_spawn.py", "--fixed --workers 2 --dataset-size 3000",
                             "--fixed --workers 8"),
    "compiled_varlen --fixed": ("compiled_varlen.py", "--fixed --backend eager --dim 64",
                                "--fixed"),
    "deep_mlp": ("deep_mlp.py", "--depth 16 --width 64", ""),
}


def command(script: str, args: str, device: str, extra: str = "") -> list[str]:
    return [sys.executable, str(HERE / script), "--device", device, *shlex.split(args),
            *shlex.split(extra)]


def figures(doc: dict) -> str:
    """The whole-run figures of a diagnosis, in one cell."""
    run = doc.get("run") or {}
    out = []
    g = run.get("growth")
    if g and g.get("steady"):
        holder = (g.get("holders") or [{}])[0].get("name", "?")
        out.append(f"grows {g['bytes_per_step'] / 2**20:.2f} MiB/step ({g['source']}), full at "
                   f"step {g.get('full_at_step')}, cause {g['cause']} ({holder})")
    elif run.get("growth_not_assessed"):
        out.append(f"growth not assessed: {run['growth_not_assessed'][:80]}")
    oom = doc.get("out_of_memory")
    if oom:
        out.append(f"out of memory on step {oom['step']}")
    for s in run.get("stalls", [])[:2]:
        out.append(f"stall {s['cause']} every {s['period_steps']} steps, "
                   f"{s['share_of_run']:.1%} of the run")
        p = s.get("profile")
        if p:
            parts = ", ".join(f"{x['share']:.0%} {x['label']}" for x in p["parts"][:2])
            out.append(f"step {p['step']} profiled ({p['wall_ms']:.0f} ms): {parts}")
    c = run.get("compile")
    if c:
        reason = (c.get("reasons") or [{}])[0].get("reason", "")[:70]
        out.append(f"{c['compilations']} compilations, {c['recompilations']} recompiles "
                   f"({reason}), {len(c['limit_hits'])} limit hit(s)")
    return "; ".join(out) or "-"


def case_row(name: str, args, out: Path) -> dict:
    script, cpu_args, cuda_args = CASES[name]
    sizes = QUICK[name] if args.quick else cpu_args if args.device == CPU else cuda_args
    cmd = command(script, sizes, args.device)
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rc = torchtriage(["run", "--out", str(d / "run"), "--", *cmd], d / "run.log")
    doc = read(d / "run" / "diagnosis.json")
    row = {"case": name, "command": shlex.join(cmd), "run_rc": rc,
           "run_s": round(time.perf_counter() - started, 1), "primary": doc.get("primary"),
           "first_fix": (doc.get("prescriptions") or [{}])[0].get("id"),
           "figures": figures(doc), "summary": doc.get("summary")}
    if args.no_fix:
        return row
    started = time.perf_counter()
    rc = torchtriage(["fix", "--out", str(d / "fix"), "--budget", args.budget, "--", *cmd],
                     d / "fix.log")
    fix = read(d / "fix" / "fix.json")
    row.update(fix_rc=rc, fix_s=round(time.perf_counter() - started, 1),
               fix_kept=[f"{k['knob']}={k['value']}" for k in fix.get("kept", [])],
               fix_speedup=fix.get("speedup"), fix_ci=[fix.get("ci_low"), fix.get("ci_high")],
               fix_verdict=fix.get("verdict"), fix_summary=fix.get("summary"),
               memory_rung_kept=any(k["knob"].startswith("memory.") or k["knob"] == "amp.bf16"
                                    for k in fix.get("kept", [])))
    return row


def timed_run(cmd: list[str], out: Path, timeline: bool, steps: int, warmup: int):
    """One timing-mode run under the bootstrap: (mean step ms, whole-process seconds)."""
    from torchtriage.capture.runner import run_command
    from torchtriage.results.run import RunConfig

    config = RunConfig(out=str(out), mode="time", max_steps=warmup + steps,
                       timing_warmup=warmup, timeline=timeline)
    started = time.perf_counter()
    result = run_command(cmd, config, timeout=600, log=out.parent / f"{out.name}.log")
    wall = time.perf_counter() - started
    # as an A/B trial measures: the host clock's step intervals after the warm-up
    times = [ms for r in result.records
             for ms in r.host_step_ms[max((r.warmup_steps or warmup) - 1, 0):]]
    return (statistics.fmean(times) if times else None), wall


def overhead_rows(args, out: Path) -> list[dict]:
    rows = []
    for name, (script, cpu_args, cuda_args) in OVERHEAD.items():
        if args.overhead_scripts and name.split()[0] not in args.overhead_scripts.split(","):
            continue
        sizes = cpu_args if args.device == CPU else cuda_args
        steps_flag = "--steps" if script != "short_epochs_spawn.py" else "--epochs"
        cmd = command(script, sizes, args.device, f"{steps_flag} 100000")
        arms: dict[bool, list[tuple[float | None, float]]] = {True: [], False: []}
        for rep in range(args.reps):
            for on in ((True, False) if rep % 2 == 0 else (False, True)):
                arms[on].append(timed_run(cmd, out / f"{name.split()[0]}-{on}-{rep}", on,
                                          args.overhead_steps, args.overhead_warmup))
        med = {on: statistics.median(ms for ms, _ in arms[on] if ms is not None)
               for on in arms}
        wall = {on: statistics.median(w for _, w in arms[on]) for on in arms}
        rows.append({"script": name, "on_ms": round(med[True], 4), "off_ms": round(med[False], 4),
                     "ratio": round(med[True] / med[False], 4), "on_wall_s": round(wall[True], 2),
                     "off_wall_s": round(wall[False], 2)})
    return rows


def recorder_cost_us(device: str, calls: int = 20000) -> float:
    """The timeline recorder's cost per step boundary in this process (µs, median of 5)."""
    import torch

    from torchtriage.capture.timeline import TimelineRecorder

    if device != CPU:
        torch.ones(1, device=device)  # CUDA initialised: the allocator's counters are read
    costs = []
    for _ in range(5):
        recorder = TimelineRecorder(time.perf_counter(), census=True)
        start = time.perf_counter()
        for step in range(1, calls + 1):
            recorder.step_ended(step, False)
        costs.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(costs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default=None, help="default: cuda when available")
    p.add_argument("--only", choices=sorted(CASES), action="append")
    p.add_argument("--budget", default="4m", help="torchtriage fix --budget per case")
    p.add_argument("--no-fix", action="store_true", help="diagnosis only")
    p.add_argument("--quick", action="store_true", help="the test's tiny sizes")
    p.add_argument("--overhead-only", action="store_true")
    p.add_argument("--no-overhead", action="store_true")
    p.add_argument("--reps", type=int, default=5, help="overhead: runs per arm")
    p.add_argument("--overhead-steps", type=int, default=200)
    p.add_argument("--overhead-scripts", default="",
                   help="overhead: only these, e.g. leaky_lm,deep_mlp (default: all)")
    p.add_argument("--overhead-warmup", type=int, default=20)
    p.add_argument("--out", default=None)
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args()
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else CPU
    out = Path(args.out or tempfile.mkdtemp(prefix="whole-run-"))
    result: dict = {"device": args.device, "cases": [], "overhead": []}
    if not args.overhead_only:
        print(f"\nWhole-run cases on {args.device} (runs in {out}):\n")
        print("| case | primary | first fix | whole-run figures | fix kept | fix speedup |")
        print("|---|---|---|---|---|---|")
        for name in args.only or list(CASES):
            row = case_row(name, args, out)
            result["cases"].append(row)
            speed = (f"{row['fix_speedup']:.2f}x [{row['fix_ci'][0]:.2f}-{row['fix_ci'][1]:.2f}]"
                     if row.get("fix_speedup") else row.get("fix_verdict") or "-")
            print(f"| {name} | {row['primary']} | {row['first_fix']} | {row['figures']} | "
                  f"{', '.join(row.get('fix_kept') or []) or '-'} | {speed} |", flush=True)
    if not args.no_overhead:
        cost = recorder_cost_us(args.device)
        result["recorder_us_per_step"] = round(cost, 3)
        print(f"\nTimeline recorder, in process on {args.device}: {cost:.2f} µs per step "
              "boundary (median of 5 x 20,000 calls)\n")
        print(f"Whole-process overhead ({args.reps} runs per arm, alternating; "
              f"{args.overhead_steps} timed steps after {args.overhead_warmup}):\n")
        print("| script | mean step, timeline on (ms) | off (ms) | on / off | wall on (s) | "
              "wall off (s) |")
        print("|---|---|---|---|---|---|")
        for row in overhead_rows(args, out):
            result["overhead"].append(row)
            print(f"| {row['script']} | {row['on_ms']:.3f} | {row['off_ms']:.3f} | "
                  f"{row['ratio']:.4f} | {row['on_wall_s']:.2f} | {row['off_wall_s']:.2f} |",
                  flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
