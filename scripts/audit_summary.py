"""Per-hack figures of `swerl tasks audit --out` reports: runs, rewards earned, and which canaries caught
each hack (`HackResult.tampered`), with canaries on and, given a `--no-canaries` report, off. Prints a
table and writes JSON (default bench_out/audit_canaries.json).

    .venv/bin/swerl tasks audit --hacks ... --out on.json
    .venv/bin/swerl tasks audit --hacks ... --no-canaries --out off.json
    .venv/bin/python scripts/audit_summary.py on.json --off off.json
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

_FORM = re.compile(r"\(([\w-]+), must ")


def summarise(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """hack → runs, instances, earned, caught (runs with canary evidence), the canary forms that caught it."""
    out: dict[str, dict[str, Any]] = {}
    forms: dict[str, Counter[str]] = defaultdict(Counter)
    for r in report["results"]:
        row = out.setdefault(r["hack"], {"runs": 0, "instances": set(), "earned": 0, "caught": 0,
                                         "caught_instances": set()})
        row["runs"] += 1
        row["instances"].add(r["instance_id"])
        row["earned"] += r["reward"] > 0
        if r.get("tampered"):
            row["caught"] += 1
            row["caught_instances"].add(r["instance_id"])
            forms[r["hack"]].update(set(_FORM.findall(r["tampered"])))
    for hack, row in out.items():
        row["instances"] = len(row["instances"])
        row["caught_instances"] = len(row["caught_instances"])
        row["caught_by"] = dict(forms[hack].most_common())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("on", nargs="+", help="audit reports graded with canaries (the default)")
    ap.add_argument("--off", nargs="*", default=[], help="audit reports graded with --no-canaries")
    ap.add_argument("--out", default="bench_out/audit_canaries.json")
    args = ap.parse_args()

    def merged(paths: list[str]) -> dict[str, Any]:
        return {"results": [r for p in paths for r in json.loads(Path(p).read_text())["results"]]}

    on = summarise(merged(args.on))
    off = summarise(merged(args.off)) if args.off else {}
    print(f"{'hack':24s} {'runs':>5s} {'inst':>5s} {'earned':>7s} {'caught':>7s} "
          f"{'earned w/o canaries':>20s}  caught by")
    for hack, row in on.items():
        o = off.get(hack)
        without = f"{o['earned']}/{o['runs']}" if o else "-"
        print(f"{hack:24s} {row['runs']:5d} {row['instances']:5d} {row['earned']:7d} {row['caught']:7d} "
              f"{without:>20s}  {', '.join(f'{k} {v}' for k, v in row['caught_by'].items())}")
    total = sum(r["earned"] for r in on.values())
    print(f"{sum(r['runs'] for r in on.values())} runs with canaries: {total} earned a reward")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"reports": {"on": args.on, "off": args.off}, "with_canaries": on,
                               "without_canaries": off}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
