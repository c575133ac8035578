"""Reading a training run back: a run directory's metrics.jsonl as a `Run` (`read_run` / `read_runs`, names
told apart), and the seeds of one arm merged into one run (`seed_group` / `merge_seeds`, with the
min-max band under `<key>:min` / `<key>:max`). What `swerl plot` and `swerl compare` read; only the
standard library."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PathLike = str | os.PathLike[str]
_NAN = float("nan")
_METRICS_FILE = "metrics.jsonl"
_HINT = f"a training run writes <run_dir>/{_METRICS_FILE}"


@dataclass(frozen=True)
class Run:
    """One training run: its display name, its directory and its metrics rows in train-step order."""

    name: str
    path: Path
    rows: tuple[dict[str, Any], ...]

    @property
    def steps(self) -> tuple[int, ...]:
        return tuple(r["train_step"] for r in self.rows)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) over the rows that hold `key`. A null, NaN or non-numeric value is NaN (a gap);
        a row without the key is left out (the metric was not logged on that step, e.g. `val/` keys off
        the evaluation steps)."""
        steps, values = [], []
        for r in self.rows:
            if key in r:
                steps.append(r["train_step"])
                values.append(_number(r[key]))
        return steps, values

    def has(self, key: str) -> bool:
        """Whether any row holds a finite value of `key`."""
        return any(math.isfinite(v) for v in self.series(key)[1])


def _number(v: Any) -> float:
    # bools are ints to Python but flags in a metrics row, not curves
    if isinstance(v, bool) or not isinstance(v, int | float):
        return _NAN
    return float(v)


def read_run(run_dir: PathLike) -> Run:
    """The run in `run_dir`, named after the directory. Undecodable lines (a torn last line of a killed
    run) are skipped, as are rows without an integer `train_step`; a step logged twice keeps its last
    row. FileNotFoundError when there is no metrics file, ValueError when it has no rows."""
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"no run directory at {path} ({_HINT})")
    file = path / _METRICS_FILE
    if not file.is_file():
        raise FileNotFoundError(f"no metrics file at {file} ({_HINT})")
    by_step: dict[int, dict[str, Any]] = {}
    for line in file.read_text().splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            step = row.get("train_step")
            if isinstance(step, int) and not isinstance(step, bool):
                by_step[step] = row
    if not by_step:
        raise ValueError(f"{file} has no metrics rows (rows are JSON objects with an integer train_step)")
    return Run(name=path.resolve().name, path=path, rows=tuple(by_step[s] for s in sorted(by_step)))


def read_runs(run_dirs: Sequence[PathLike]) -> list[Run]:
    """`read_run` of each directory; runs whose directories share a name are told apart by as many
    parent folders as it takes (`a/run` vs `b/run`)."""
    runs = [read_run(d) for d in run_dirs]
    resolved = [r.path.resolve() for r in runs]
    for i, p in enumerate(resolved):
        if p in resolved[:i]:
            raise ValueError(f"run {runs[i].path} is given twice")
    names = _distinct_names(resolved)
    return [dataclasses.replace(r, name=n) for r, n in zip(runs, names, strict=True)]


def _distinct_names(paths: Sequence[Path]) -> list[str]:
    depth = [1] * len(paths)
    while True:
        names = ["/".join(p.parts[-d:]) if d < len(p.parts) else str(p)
                 for p, d in zip(paths, depth, strict=True)]
        clash = [i for i, n in enumerate(names) if names.count(n) > 1 and depth[i] < len(paths[i].parts)]
        if not clash:
            return names
        for i in clash:
            depth[i] += 1


_SEED = re.compile(r"^(?:seed|s)?(\d+)$|^(.+?)[-_.](?:seed|s)(\d+)$", re.I)
BAND_MIN, BAND_MAX = ":min", ":max"
"""Suffixes of the per-step minimum and maximum over seeds in a `merge_seeds` run (`reward/mean:min`)."""


def seed_group(path: Path) -> Path | None:
    """The arm a seed's run directory belongs to, or None when its name names no seed: `…/ARM/seed3`,
    `…/ARM/s3` and `…/ARM/3` belong to `…/ARM`; `…/ARM-seed3`, `…/ARM_s3` to `…/ARM`."""
    m = _SEED.match(path.name)
    if m is None:
        return None
    return path.parent if m.group(1) is not None else path.parent / m.group(2)


def merge_seeds(runs: Sequence[Run]) -> list[Run]:
    """Runs that differ only in their seed (`seed_group`) as one run each, in first-seen order: at every
    step all of them logged, each numeric metric's mean over the seeds, with its minimum and maximum
    under `<key>:min` / `<key>:max` (the dashboard shades that band). A run without a seed in its name
    stays as it is. Named `<arm> (n seeds)`."""
    groups: dict[Path, list[Run]] = {}
    for r in runs:
        key = seed_group(r.path.resolve())
        groups.setdefault(key if key is not None else r.path.resolve(), []).append(r)
    names = _distinct_names(list(groups))
    out = []
    for (path, members), name in zip(groups.items(), names, strict=True):
        if len(members) == 1 and seed_group(members[0].path.resolve()) is None:
            out.append(members[0])
            continue
        by_step = [{row["train_step"]: row for row in m.rows} for m in members]
        rows = []
        for step in sorted(set.intersection(*(set(b) for b in by_step))):
            at = [b[step] for b in by_step]
            row: dict[str, Any] = {"train_step": step}
            for k in dict.fromkeys(k for a in at for k in a):
                vals = [_number(a.get(k)) for a in at]
                if k == "train_step" or not all(math.isfinite(v) for v in vals):
                    continue
                row[k] = sum(vals) / len(vals)
                row[k + BAND_MIN], row[k + BAND_MAX] = min(vals), max(vals)
            rows.append(row)
        if not rows:
            raise ValueError(f"the seeds of {path} share no logged step")
        out.append(Run(name=f"{name} ({len(members)} seeds)", path=path, rows=tuple(rows)))
    return out


def _as_runs(runs: Sequence[Run | PathLike]) -> list[Run]:
    if all(isinstance(r, Run) for r in runs):
        return list(runs)  # type: ignore[arg-type]
    return read_runs([r.path if isinstance(r, Run) else r for r in runs])
