"""The published row forms besides SWE-bench's, made SWE-bench-form records that
`swerl.envs.swe.instances` validates, each with how its tests run; and SWE-Gym's own spec tables.

A row's form is told from its fields (`detect_form`); a row with the fields of two forms is an error,
never a guess:

- `swebench`: SWE-bench, Lite, Verified, SWE-Gym and sets in their schema (`test_patch`, `version`,
  ...). Rows as published are completed by `swerl.envs.swe.specs`: from SWE-bench's spec tables, or,
  for the repositories SWE-Gym added (`SWEGYM_REPOS`), from SWE-Gym's (`derive_swegym`).
- `swesmith`: SWE-smith's task instances (`image_name`; `patch` is the diff that *creates* the bug).
  The gold patch is that diff reversed; the tests run in the row's `image_name` as the repository's
  SWE-smith profile runs them (swesmith `SWESMITH_RELEASE`, in a process of its own), plus pytest's
  `-rA` summary, so that swebench's `parse_log_pytest` reads the outcomes the profile's own parser reads
  from the verbose lines. Python profiles with SWE-smith's default pytest parser are supported; any
  other profile is a clear error. The start state: SWE-smith's images hold its mirror of the repository
  (one commit, the clean code) and its harness fetches the instance's bug branch from GitHub; swerl
  instead commits the bug patch onto the image's HEAD in the scrubbed layer (base_commit `IMAGE_HEAD`,
  `setup_patch` the bug). A row's own `base_commit`, where an export has one, names a commit of that
  branch, which no image holds, so it is not used. Unlike SWE-smith's branches, the FAIL_TO_PASS test
  files are not removed from the agent's tree.
- `r2egym`: R2E-Gym's rows (`docker_image`, `parsed_commit_content`, `execution_result_content`,
  `expected_output_json`; no instance_id: it is made `<owner>__<repo>-<fixed commit>`). The start
  state is the commit's parent (the image checks it out); the gold patch is the commit's non-test
  Python diffs and test_patch its test-file ones, as R2E-Gym's `ParsedCommit.get_patch` writes them (its
  validation applies both); the tests are R2E-Gym's own, from the image's /r2e_tests, run with the
  command R2E-Gym wrote to run_tests.sh. R2E-Gym rewards a run whose parsed outcomes equal
  `expected_output_json` exactly; swerl converts that into FAIL_TO_PASS / PASS_TO_PASS: the tests
  R2E-Gym expects to pass, named as swebench's `parse_log_pytest` names them in the run recorded at the
  fixed commit, split by the run recorded at the buggy one (both in `execution_result_content`). The
  conversion is checked against `expected_output_json`: the tests it requires to pass are exactly those
  R2E-Gym expects to pass, or the row is refused. Not carried over: R2E-Gym also wants the tests
  expected to fail to keep failing (and the same number of tests); swerl asks that the expected passes
  pass.

The package: `common` (FormError and shared helpers), `detect` (`detect_form`, `convert_rows`),
`swe_smith`, `r2e_gym` and `swe_gym` (one module per published form), `oracle` (the pinned upstream
code, run in a process of its own: `python oracle.py swesmith|swegym`, JSON on stdin and stdout, the
process that imports swesmith or SWE-Gym's fork of swebench, never swerl's pinned swebench).
"""

from swerl.envs.swe.forms.common import FormError
from swerl.envs.swe.forms.detect import FORM_NAMES, FORMS, MARKERS, convert_rows, detect_form
from swerl.envs.swe.forms.oracle import (
    SWEGYM_FORK,
    SWEGYM_FORK_COMMIT,
    SWESMITH_RELEASE,
    swesmith_release_dir,
)
from swerl.envs.swe.forms.r2e_gym import (
    R2E_REPOS,
    R2E_REVISION,
    R2E_RUNNERS,
    R2E_TESTS_CMD,
    r2e_patches,
    r2egym_record,
)
from swerl.envs.swe.forms.swe_gym import (
    SWEGYM_IMAGE_PREFIX,
    SWEGYM_REPOS,
    derive_swegym,
    is_swegym_repo,
    swegym_fork_dir,
    swegym_image,
)
from swerl.envs.swe.forms.swe_smith import IMAGE_HEAD, reverse_patch, swesmith_record

__all__ = [
    "FORMS", "FORM_NAMES", "IMAGE_HEAD", "MARKERS", "R2E_REPOS", "R2E_REVISION", "R2E_RUNNERS",
    "R2E_TESTS_CMD", "SWEGYM_FORK", "SWEGYM_FORK_COMMIT", "SWEGYM_IMAGE_PREFIX", "SWEGYM_REPOS",
    "SWESMITH_RELEASE", "FormError", "convert_rows", "derive_swegym", "detect_form", "is_swegym_repo",
    "r2e_patches", "r2egym_record", "reverse_patch", "swegym_fork_dir", "swegym_image", "swesmith_record",
    "swesmith_release_dir",
]
