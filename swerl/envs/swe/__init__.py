"""SWE tasks: SWE-bench-schema instances, their images, grading with swebench's own code, and an
offline generator of bug-fix tasks from small pure-Python libraries.

    from swerl.envs.swe import load_instances, grade_patch
"""

from swerl.envs.swe.env import SWEEnv
from swerl.envs.swe.grading import grade_patch
from swerl.envs.swe.instances import load_instances, load_predictions, parse_instance

__all__ = ["SWEEnv", "grade_patch", "load_instances", "load_predictions", "parse_instance"]
