"""SWE tasks: SWE-bench-schema instances, their images, grading with swebench's own code, and an
offline generator of bug-fix tasks from small pure-Python libraries.

    from swerl.envs.swe import load_instances, grade_patch
"""

from __future__ import annotations

import importlib
from typing import Any

# Resolved on first use: importing swebench takes about a second, and the env registry (hence every
# `swerl` command) imports `swerl.envs.swe.tasks` for its config type only.
_EXPORTS = {
    "SWEEnv": "swerl.envs.swe.env",
    "grade_patch": "swerl.envs.swe.grading",
    "load_instances": "swerl.envs.swe.instances",
    "load_predictions": "swerl.envs.swe.instances",
    "parse_instance": "swerl.envs.swe.instances",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


__all__ = ["SWEEnv", "grade_patch", "load_instances", "load_predictions", "parse_instance"]
