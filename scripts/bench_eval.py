"""Benchmark grading: seconds per graded instance (images cached), instances per minute at concurrency
1 and 4, and swerl's grading against the official SWE-bench harness (the pinned `swebench` package's
`run_evaluation`) on the same predictions, the same instances and the same local images, in one run.
Writes bench_out/bench_eval.json.

    .venv/bin/python scripts/bench_eval.py [--tasks tasks/swe/instances.jsonl] [--n 8]
    .venv/bin/python scripts/bench_eval.py --n 4 --concurrency none --empty   # the comparison only
    .venv/bin/python scripts/bench_eval.py --n 10 --concurrency none --empty --wrong --canary-rounds 3

swerl grades with its canary tests on (the default), so the comparison is with canaries on. `--wrong`
compares a wrong patch too: the reverse of another instance's gold patch of the same library, which
applies and puts that instance's bug in, leaving this one's (unresolved on both sides).
`--canary-rounds R` measures what the canaries cost: each instance's gold patch graded R times with and
R times without them, alternating, on the same image (`canary_cost` in the JSON: seconds per grading
on / off, and their ratio).

The comparison (concurrency 1 on both sides, sequential): each chosen instance becomes a row of the
form swebench 5 evaluates (`swebench.harness.utils.make_test_spec`: instance_id, repo, version,
base_commit, patch, test_patch, FAIL_TO_PASS, PASS_TO_PASS, image = the scrubbed local image swerl
resolves, eval_script = `swerl.envs.swe.grading.eval_script`, log_parser, eval_type) in a temporary
jsonl, the predictions (the gold patch; with --empty also the empty patch) in another, and
`swebench.harness.run_evaluation.main` (the function behind `python -m swebench.harness.run_evaluation`)
grades them one instance per call, alternating with swerl's `grade_patch` (which goes first alternates,
so drift in the machine's load falls on both). Per instance two official times are kept: its
`run_instance` (container create → patch → eval script → grade → container removed: the same work as one
`grade_patch`) and the whole `main()` call (adds loading the dataset and predictions and the run report,
which lists every image and container of the daemon; a batch run pays those once). Both sides must
agree on resolved / unresolved per instance; a disagreement is printed loudly and makes the exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from swerl.envs.swe.grading import eval_script, grade_patch
from swerl.envs.swe.images import resolve_image
from swerl.envs.swe.instances import load_instances
from swerl.envs.swe.types import SWEInstance

FAIRNESS_NOTES = [
    "Same image (swerl's scrubbed local layer), same eval script text (swerl's eval_script(instance)), "
    "same patch, same apply chain (swerl imports the harness's GIT_APPLY_CMDS), same log parser and "
    "get_resolution_status: the difference is the container and the steps around the eval script.",
    "Official container: user root, default (bridge) network, no CPU / memory / pids limit, cap_add "
    "SYS_ADMIN, `tail -f /dev/null` as PID 1 without init; patch and eval.sh written to the host log dir, "
    "tarred and put_archive'd (each after a `mkdir -p` exec); `git diff` before and after the eval script "
    "(two more execs); removal by `docker stop --time=15` + remove through the docker CLI in a subprocess "
    "(instant here: the image's STOPSIGNAL is SIGKILL; on an image without it `tail` as PID 1 ignores "
    "SIGTERM and the stop waits the full 15 s).",
    "swerl container: the image's swerl.user (non-root) for the commands, network none, 1 CPU, 2 GiB "
    "memory, pids limit, dropped capabilities, no-new-privileges, docker-init + a supervisor shell "
    "session over one exec; swerl also runs guard_test_run (puts test infrastructure back to base_commit: "
    "git ls-tree/checkout/ls-files; a module listing only when the patch adds files) and exports "
    "PYTHONSAFEPATH=1 for the tests: work the official harness does not do.",
    "Empty patches: the official harness skips them without starting a container (reported as "
    "empty_patch, i.e. unresolved), and so does `swerl eval predictions`; this benchmark calls swerl's "
    "grade_patch directly, which runs the tests at base_commit (what `swerl tasks validate` checks). "
    "Empty-patch rows are therefore left out of the timing ratio and only checked for agreement.",
]

WORKAROUNDS = [
    "RUN_EVALUATION_LOG_DIR is the relative path logs/run_evaluation: main() runs with the working "
    "directory set to a temporary folder so nothing is written into the repository.",
    "swebench 5's make_test_spec needs image / eval_script / log_parser / eval_type in the row, which "
    "swerl's shipped rows (test_cmd) lack: the rows carry swerl's resolved image and eval_script.",
    "create_container pulls when the image is not local: every image is checked to be local first, so no "
    "pull happens (and none could: swerl's images exist only here).",
    "run_instance returns a report whose report.json short-circuits a rerun: each run gets a fresh run_id.",
    "make_run_report (called by main() after the instance ran) lists every container of the daemon and "
    "inspects each one; on a daemon shared with other jobs a container removed between the list and the "
    "inspect raises docker.errors.NotFound and main() dies after the grading is done. It is retried "
    "(summary.run_report_retries counts them; the retries' time is in main_s).",
    "Per-instance times come from wrapping run_evaluation.run_instance (the module global that "
    "run_instances hands to run_threadpool); the harness itself is unchanged.",
]


def choose(instances: list[SWEInstance], n: int) -> list[SWEInstance]:
    """n instances, round-robin over libraries, so the figure is not one test suite's."""
    by_lib: dict[str, list] = {}
    for inst in instances:
        by_lib.setdefault(inst.repo, []).append(inst)
    chosen: list[SWEInstance] = []
    while len(chosen) < n and any(by_lib.values()):
        for lib in sorted(by_lib):
            if by_lib[lib] and len(chosen) < n:
                chosen.append(by_lib[lib].pop(0))
    return chosen


def official_row(instance: SWEInstance, image: str) -> dict:
    """The instance as a swebench-5 evaluation row (what `make_test_spec` reads), on swerl's image."""
    rec = instance.to_swebench()
    row = {k: rec[k] for k in ("instance_id", "repo", "version", "base_commit", "patch", "test_patch",
                               "FAIL_TO_PASS", "PASS_TO_PASS", "log_parser", "eval_type")}
    row.update(image=image, eval_script=eval_script(instance))
    return row


def machine_info() -> dict:
    info: dict[str, Any] = {"cpus": os.cpu_count(), "platform": platform.platform(),
                            "python": platform.python_version()}
    with contextlib.suppress(OSError):
        info["loadavg_start"] = [round(x, 2) for x in os.getloadavg()]
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem = Path("/proc/meminfo").read_text().split("\n")[0].split()
        info["mem_gib"] = round(int(mem[1]) / 2**20, 1)
    with contextlib.suppress(Exception):
        import docker

        v = docker.from_env(timeout=30).version()
        info["docker"] = v.get("Version")
    with contextlib.suppress(Exception):
        import swebench

        info["swebench"] = swebench.__version__
    return info


def _stat(xs: list[float]) -> dict:
    return {"mean": round(statistics.mean(xs), 3), "median": round(statistics.median(xs), 3),
            "min": round(min(xs), 3), "max": round(max(xs), 3)} if xs else {}


def _mean(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.mean(xs), 3) if xs else None


def _test_runtime(log: Path) -> float | None:
    """'Test runtime: 1.23 seconds' from the harness's run_instance.log."""
    if not log.is_file():
        return None
    m = re.search(r"Test runtime: ([0-9_.]+) seconds", log.read_text(errors="replace"))
    return float(m.group(1).replace("_", "")) if m else None


def reverse_patch(patch: str) -> str:
    """The unified diff undone: sides swapped in each file header and hunk, `-` and `+` lines swapped."""
    out = []
    for line in patch.splitlines(keepends=True):
        if line.startswith("--- a/"):
            line = "+++ b/" + line[6:]
        elif line.startswith("+++ b/"):
            line = "--- a/" + line[6:]
        elif line.startswith("@@"):
            m = re.match(r"@@ -(\S+) \+(\S+) @@(.*)", line, re.S)
            line = f"@@ -{m.group(2)} +{m.group(1)} @@{m.group(3)}" if m else line
        elif line.startswith("-"):
            line = "+" + line[1:]
        elif line.startswith("+"):
            line = "-" + line[1:]
        out.append(line)
    # `--- a/x` must come before `+++ b/x`: each header pair was swapped line by line above
    text = "".join(out)
    return re.sub(r"^(\+\+\+ b/.*\n)(--- a/.*\n)", r"\2\1", text, flags=re.M)


def wrong_patches(chosen: list[SWEInstance], pool: list[SWEInstance]) -> dict[str, str]:
    """Per instance, a wrong patch: another instance's gold patch of the same library, reversed (its bug
    put in, this one's left); one touching other files than this instance's gold patch first."""
    out = {}
    for inst in chosen:
        mine = set(re.findall(r"^\+\+\+ b/(\S+)", inst.patch, re.M))
        others = [o for o in pool if o.repo == inst.repo and o.instance_id != inst.instance_id]
        others.sort(key=lambda o: bool(set(re.findall(r"^\+\+\+ b/(\S+)", o.patch, re.M)) & mine))
        if others:
            out[inst.instance_id] = reverse_patch(others[0].patch)
    return out


def canary_cost(chosen: list[SWEInstance], images: dict[str, str], rounds: int) -> dict:
    """Seconds per grading of the gold patch with canaries and without, `rounds` each, alternating."""
    from swerl.envs.swe.types import GradingConfig

    on_cfg, off_cfg = GradingConfig(), GradingConfig(canaries=False)
    rows = []
    for n, inst in enumerate(chosen):
        times: dict[str, list[float]] = {"on": [], "off": []}
        tests: dict[str, list[float]] = {"on": [], "off": []}
        placed = 0
        for r in range(rounds):
            order = ("on", "off") if (n + r) % 2 == 0 else ("off", "on")
            for kind in order:
                g = grade_patch(inst, inst.patch, image=images[inst.instance_id],
                                config=on_cfg if kind == "on" else off_cfg)
                if not g.resolved or g.tampered:
                    raise SystemExit(f"{inst.instance_id}: gold graded {g.status} {g.tampered or g.error}")
                times[kind].append(g.total_s)
                tests[kind].append(g.test_s)
                placed = max(placed, g.canaries)
        rows.append({"instance_id": inst.instance_id, "canaries": placed,
                     "on_s": _stat(times["on"]), "off_s": _stat(times["off"]),
                     "test_on_s": _stat(tests["on"]), "test_off_s": _stat(tests["off"])})
        print(f"{inst.instance_id:40s} canaries {placed}: grading {rows[-1]['on_s']['mean']:.2f}s on, "
              f"{rows[-1]['off_s']['mean']:.2f}s off", flush=True)
    on = statistics.mean(r["on_s"]["mean"] for r in rows)
    off = statistics.mean(r["off_s"]["mean"] for r in rows)
    return {"rounds": rounds, "rows": rows, "summary": {
        "grading_s_on_mean": round(on, 3), "grading_s_off_mean": round(off, 3),
        "extra_s_per_grading": round(on - off, 3), "ratio_on_over_off": round(on / off, 4)}}


def compare(chosen: list[SWEInstance], images: dict[str, str], *, empty: bool, timeout: int,
            wrong: dict[str, str] | None = None) -> dict:
    """swerl's grade_patch and the official harness, interleaved per instance (see the docstring)."""
    import docker
    import swebench.harness.run_evaluation as rev
    from swebench.harness.constants import LOG_INSTANCE, RUN_EVALUATION_LOG_DIR

    client = docker.from_env(timeout=120)
    for image in images.values():  # the harness would pull a missing image: make sure it will not
        client.images.get(image)
    work = Path(tempfile.mkdtemp(prefix="swerl-bench-official-"))
    dataset = work / "dataset.jsonl"
    dataset.write_text("".join(json.dumps(official_row(i, images[i.instance_id])) + "\n" for i in chosen))
    kinds = {"gold": {i.instance_id: i.patch for i in chosen}}
    if empty:
        kinds["empty"] = {i.instance_id: "" for i in chosen}
    if wrong:
        kinds["wrong"] = wrong
    stamp = time.strftime("%Y%m%d-%H%M%S")
    preds_path, run_ids = {}, {}
    for kind, patches in kinds.items():
        preds_path[kind] = work / f"predictions-{kind}.jsonl"
        preds_path[kind].write_text("".join(
            json.dumps({"instance_id": iid, "model_patch": p, "model_name_or_path": f"swerl-bench-{kind}"})
            + "\n"
            for iid, p in patches.items()))
        run_ids[kind] = f"swerl-bench-{stamp}-{kind}"

    run_instance_s: dict[tuple[str, str], float] = {}
    original = rev.run_instance

    def timed_run_instance(test_spec: Any, pred: dict, *a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return original(test_spec, pred, *a, **kw)
        finally:
            run_instance_s[(pred["model_name_or_path"], test_spec.instance_id)] = time.perf_counter() - t

    report_retries: list[str] = []
    original_report = rev.make_run_report

    def make_run_report_retrying(*a: Any, **kw: Any) -> Any:
        # the report lists every container of the daemon and inspects each: one another job removes
        # in between raises NotFound (docker-py's list is not atomic). Retried, the harness unchanged.
        for attempt in range(5):
            try:
                return original_report(*a, **kw)
            except docker.errors.NotFound as e:
                report_retries.append(str(e)[:200])
                if attempt == 4:
                    raise
                time.sleep(0.2)
        raise AssertionError("unreachable")

    harness_log = work / "official_harness_output.log"
    rows = []
    cwd = os.getcwd()
    rev.run_instance, rev.make_run_report = timed_run_instance, make_run_report_retrying
    os.chdir(work)
    try:
        for n_inst, inst in enumerate(chosen):
            iid = inst.instance_id
            for n_kind, (kind, patches) in enumerate(kinds.items()):
                if iid not in patches:
                    continue
                swerl_first = (n_inst + n_kind) % 2 == 0  # alternates per instance, for each prediction
                row: dict[str, Any] = {"instance_id": iid, "repo": inst.repo, "prediction": kind,
                                       "first": "swerl" if swerl_first else "official"}
                order = ("swerl", "official") if swerl_first else ("official", "swerl")
                for who in order:
                    if who == "swerl":
                        t = time.perf_counter()
                        g = grade_patch(inst, patches[iid], image=images[iid])
                        row["swerl"] = {
                            "s": round(time.perf_counter() - t, 3),
                            "verdict": "error" if g.failed else ("resolved" if g.resolved else "unresolved"),
                            "start_s": round(g.start_s, 3), "apply_s": round(g.apply_s, 3),
                            "test_s": round(g.test_s, 3), "error": (g.error or "")[:300],
                            "canaries": g.canaries, "tampered": g.tampered[:300]}
                    else:
                        model = f"swerl-bench-{kind}"
                        t = time.perf_counter()
                        with open(harness_log, "a") as logf, contextlib.redirect_stdout(logf), \
                                contextlib.redirect_stderr(logf):
                            print(f"=== {iid} {kind}", flush=True)
                            report_file = rev.main(
                                dataset_name=str(dataset), split="test", instance_ids=[iid],
                                predictions_path=str(preds_path[kind]), max_workers=1, open_file_limit=4096,
                                run_id=run_ids[kind], timeout=timeout, rewrite_reports=False, modal=False,
                                report_dir=str(work / "reports"))
                        wall = time.perf_counter() - t
                        report = json.loads(Path(report_file).read_text())
                        if iid in report["resolved_ids"]:
                            v = "resolved"
                        elif iid in report["unresolved_ids"] or iid in report["empty_patch_ids"]:
                            v = "unresolved"
                        else:
                            v = "error"
                        ri = run_instance_s.get((model, iid))
                        log = RUN_EVALUATION_LOG_DIR / run_ids[kind] / model / iid / LOG_INSTANCE
                        row["official"] = {
                            "s": None if ri is None else round(ri, 3), "main_s": round(wall, 3),
                            "verdict": v, "ran_container": ri is not None,
                            "test_s": _test_runtime(work / log),
                            "empty_patch": iid in report["empty_patch_ids"],
                            "error": iid in report["error_ids"]}
                row["agree"] = row["swerl"]["verdict"] == row["official"]["verdict"]
                row["expected"] = "resolved" if kind == "gold" else "unresolved"
                rows.append(row)
                s, o = row["swerl"], row["official"]
                flag = "" if row["agree"] else "   <<< MISMATCH"
                print(f"{iid:40s} {kind:5s} swerl {s['s']:7.2f}s {s['verdict']:10s} official "
                      f"{'-' if o['s'] is None else format(o['s'], '7.2f')}s (main {o['main_s']:.2f}s) "
                      f"{o['verdict']}{flag}", flush=True)
    finally:
        os.chdir(cwd)
        rev.run_instance, rev.make_run_report = original, original_report

    timed = [r for r in rows if r["official"]["s"] is not None]
    swerl_s = [r["swerl"]["s"] for r in timed]
    official_s = [r["official"]["s"] for r in timed]
    official_main_s = [r["official"]["main_s"] for r in timed]
    mismatches = [f"{r['instance_id']} ({r['prediction']}): swerl {r['swerl']['verdict']}, official "
                  f"{r['official']['verdict']}" for r in rows if not r["agree"]]
    unexpected = [f"{r['instance_id']} ({r['prediction']}): {who} {r[who]['verdict']}, expected "
                  f"{r['expected']}"
                  for r in rows for who in ("swerl", "official") if r[who]["verdict"] != r["expected"]]
    summary = {
        "instances_timed": len(timed),
        "swerl_s_per_instance": _stat(swerl_s),
        "official_s_per_instance": _stat(official_s),
        "official_main_s_per_instance": _stat(official_main_s),
        "ratio_official_over_swerl_mean": round(statistics.mean(official_s) / statistics.mean(swerl_s), 3)
        if timed else None,
        "ratio_official_main_over_swerl_mean": round(statistics.mean(official_main_s)
                                                     / statistics.mean(swerl_s), 3)
        if timed else None,
        "ratio_official_over_swerl_median": round(statistics.median(official_s) / statistics.median(swerl_s),
                                                  3)
        if timed else None,
        # the eval script's own run (the tests) on each side, and everything else (the grader's overhead:
        # container start / removal, patch, copies, guards, parsing), which is what a grader controls
        "swerl_test_s_mean": _mean([r["swerl"]["test_s"] for r in timed]),
        "official_test_s_mean": _mean([r["official"]["test_s"] for r in timed]),
        "swerl_overhead_s_mean": _mean([r["swerl"]["s"] - r["swerl"]["test_s"] for r in timed]),
        "official_overhead_s_mean": _mean([r["official"]["s"] - r["official"]["test_s"] for r in timed
                                           if r["official"]["test_s"] is not None]),
        "agreement": f"{sum(r['agree'] for r in rows)}/{len(rows)}",
        "run_report_retries": len(report_retries),
        "mismatches": mismatches, "unexpected_verdicts": unexpected,
    }
    so, oo = summary["swerl_overhead_s_mean"], summary["official_overhead_s_mean"]
    summary["ratio_official_over_swerl_overhead"] = round(oo / so, 3) if so and oo is not None else None
    return {"harness": "swebench.harness.run_evaluation.main (per instance, max_workers=1)",
            "concurrency": 1, "timeout_s": timeout, "work_dir": str(work), "harness_output": str(harness_log),
            "summary": summary, "per_instance": rows, "fairness_notes": FAIRNESS_NOTES,
            "workarounds": WORKAROUNDS}


def print_table(cmp: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    s = cmp["summary"]
    rows = cmp["per_instance"]
    console = Console(width=160)
    t = Table(title="grading the same predictions on the same images, concurrency 1 (gold patches timed)")
    for col in ("what", "instances", "s/instance mean", "s/instance median", "test s mean", "overhead s mean",
                "resolved"):
        t.add_column(col, justify="right" if col != "what" else "left")
    for kind in sorted({r["prediction"] for r in rows}):
        mine = [r for r in rows if r["prediction"] == kind]
        for who, key, label in (("swerl", "s", "swerl grade_patch"),
                                ("official", "s", "official run_instance"),
                                ("official", "main_s", "official main() call")):
            xs = [r[who][key] for r in mine if r[who][key] is not None]
            tests = [r[who]["test_s"] for r in mine if r[who]["test_s"] is not None]
            over = [r[who]["s"] - r[who]["test_s"] for r in mine
                    if key == "s" and r[who]["s"] is not None and r[who]["test_s"] is not None]
            res = sum(r[who]["verdict"] == "resolved" for r in mine)
            t.add_row(f"{label} ({kind})", str(len(mine)),
                      f"{statistics.mean(xs):.2f}" if xs else "- (not run)",
                      f"{statistics.median(xs):.2f}" if xs else "-",
                      f"{statistics.mean(tests):.2f}" if tests and key == "s" else "-",
                      f"{statistics.mean(over):.2f}" if over else "-",
                      f"{res}/{len(mine)}")
    console.print(t)
    console.print(f"ratio official/swerl (s per instance, gold): run_instance mean "
                  f"[bold]{s['ratio_official_over_swerl_mean']}[/bold] (median "
                  f"{s['ratio_official_over_swerl_median']}), whole main() call "
                  f"{s['ratio_official_main_over_swerl_mean']}, overhead outside the tests "
                  f"{s['ratio_official_over_swerl_overhead']}; verdicts agree {s['agreement']}")
    for m in s["mismatches"]:
        console.print(f"[bold red]MISMATCH[/bold red] {m}")
    for m in s["unexpected_verdicts"]:
        console.print(f"[bold red]UNEXPECTED[/bold red] {m}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="tasks/swe/instances.jsonl")
    ap.add_argument("--n", type=int, default=8, help="instances graded per concurrency level and compared")
    ap.add_argument("--concurrency", default="1,4", help="levels for swerl alone; 'none' skips them")
    ap.add_argument("--official", action=argparse.BooleanOptionalAction, default=True,
                    help="also grade with the official SWE-bench harness and compare")
    ap.add_argument("--empty", action="store_true", help="compare the empty patch too (agreement only)")
    ap.add_argument("--wrong", action="store_true", help="compare a wrong patch too (agreement only)")
    ap.add_argument("--canary-rounds", type=int, default=0,
                    help="gradings per instance with and without canaries, for their cost (0: skip)")
    ap.add_argument("--timeout", type=int, default=1800, help="test timeout, both graders")
    ap.add_argument("--out", default="bench_out/bench_eval.json")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    chosen = choose(load_instances(args.tasks), args.n)
    results: dict[str, Any] = {"instances": [i.instance_id for i in chosen], "machine": machine_info()}
    results["cpus"], results["platform"] = results["machine"]["cpus"], results["machine"]["platform"]
    t = time.perf_counter()
    images = {i.instance_id: resolve_image(i) for i in chosen}  # warm: the benchmark measures grading
    results["image_warmup_s"] = round(time.perf_counter() - t, 2)
    results["images"] = images
    results["levels"] = {}
    levels = [] if args.concurrency.strip().lower() in ("", "none", "0") else \
        [int(x) for x in args.concurrency.split(",")]
    for level in levels:
        t = time.perf_counter()
        with ThreadPoolExecutor(max_workers=level) as pool:
            grades = list(pool.map(lambda i: grade_patch(i, i.patch, image=images[i.instance_id]), chosen))
        wall = time.perf_counter() - t
        bad = [g.instance_id for g in grades if not g.resolved]
        per = [g.total_s for g in grades]
        results["levels"][str(level)] = {
            "wall_s": round(wall, 2), "instances_per_min": round(60 * len(chosen) / wall, 2),
            "s_per_instance_mean": round(statistics.mean(per), 2),
            "s_per_instance_median": round(statistics.median(per), 2),
            "start_s_mean": round(statistics.mean(g.start_s for g in grades), 3),
            "apply_s_mean": round(statistics.mean(g.apply_s for g in grades), 3),
            "test_s_mean": round(statistics.mean(g.test_s for g in grades), 3),
            "not_resolved": bad}
        print(f"concurrency {level}: {results['levels'][str(level)]}", flush=True)
    failed = False
    if args.canary_rounds > 0:
        results["canary_cost"] = canary_cost(chosen, images, args.canary_rounds)
        print(f"canary cost: {results['canary_cost']['summary']}", flush=True)
    if args.official:
        wrong = wrong_patches(chosen, load_instances(args.tasks)) if args.wrong else None
        cmp = compare(chosen, images, empty=args.empty, timeout=args.timeout, wrong=wrong)
        results["official_comparison"] = cmp
        print_table(cmp)
        failed = bool(cmp["summary"]["mismatches"])
    with contextlib.suppress(OSError):
        results["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
