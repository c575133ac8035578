"""Log parsers that published rows name but the pinned swebench does not have, added to swebench's
`PARSER_REGISTRY` (importing this module does it), so that its grading (`get_logs_eval`) finds them
by the row's `log_parser` as it finds its own.

- `parse_log_pytest_pydantic`: SWE-Gym's parser for pydantic/pydantic (SWE-Gym's fork of swebench,
  swebench/harness/log_parsers.py at `swerl.envs.swe.forms.SWEGYM_FORK_COMMIT`, l. 244-272), which its
  FAIL_TO_PASS / PASS_TO_PASS names were recorded with. pydantic's test command prints each test
  verbosely (`-vv -o console_output_style=classic`), so a result is either pytest's summary line
  (`PASSED tests/x.py::test_a`) or a verbose one that ends in its status
  (`tests/x.py::test_a PASSED`), both with colour codes.
"""

from __future__ import annotations

import re

from swebench.harness.constants import TestStatus
from swebench.harness.log_parsers import PARSER_REGISTRY

_COLOUR = re.compile(r"\[\d+m")
"""What is left of an ANSI colour code (`ESC[32m`) once the control characters go; removed first, as
SWE-Gym's parser does, so `[32mPASSED` reads `PASSED`."""
_CONTROL = str.maketrans("", "", "".join(chr(c) for c in range(1, 32)))
_FAILED_PROGRESS = re.compile(r"FAILED\s*\[.*?\]")
"""`FAILED [ 50%]`: the progress pytest puts after a verbose FAILED."""


def parse_log_pytest_pydantic(log: str, test_spec: object = None) -> dict[str, str]:
    """Test name → status, read as SWE-Gym reads pydantic's logs. A status at the start names the test
    after it (a FAILED line's ` - reason` is dropped); a line that ends in a status names the test at
    its start. Unlike SWE-Gym's, a line holding nothing but a status is skipped, not an IndexError."""
    statuses = tuple(s.value for s in TestStatus)
    out: dict[str, str] = {}
    for raw in log.split("\n"):
        line = _FAILED_PROGRESS.sub("FAILED", _COLOUR.sub("", raw).translate(_CONTROL))
        if line.startswith(statuses):
            if line.startswith(TestStatus.FAILED.value):
                line = line.replace(" - ", " ")
            words = line.split()
            if len(words) > 1:
                out[words[1]] = words[0]
        elif line.endswith(statuses):
            words = line.split()
            if len(words) > 1:
                out[words[0]] = words[1]
    return out


EXTRA_PARSERS = {"parse_log_pytest_pydantic": parse_log_pytest_pydantic}
for _name, _parser in EXTRA_PARSERS.items():
    PARSER_REGISTRY.setdefault(_name, _parser)
