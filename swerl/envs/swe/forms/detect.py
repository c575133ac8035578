"""Telling a row's form from its fields (`detect_form`) and making every SWE-smith and R2E-Gym row of a
source a SWE-bench-form record (`convert_rows`); SWE-bench-form rows (SWE-bench, Lite, Verified, SWE-Gym)
pass through as they are, for `swerl.envs.swe.instances` and `swerl.envs.swe.specs` to judge and complete.
"""

from __future__ import annotations

from typing import Any

from swerl.envs.swe.forms.common import FormError, _where
from swerl.envs.swe.forms.oracle import _run_oracle
from swerl.envs.swe.forms.r2e_gym import r2egym_record
from swerl.envs.swe.forms.swe_smith import _swesmith_fields, _swesmith_request, swesmith_record

FORMS = ("swebench", "swesmith", "r2egym")
FORM_NAMES = {"swebench": "SWE-bench", "swesmith": "SWE-smith", "r2egym": "R2E-Gym"}
MARKERS = {
    "swebench": ("test_patch",),
    "swesmith": ("image_name",),
    "r2egym": ("docker_image", "parsed_commit_content", "execution_result_content", "expected_output_json"),
}
"""The fields that tell a form: SWE-bench's `test_patch` (no SWE-smith or R2E-Gym row has one), SWE-smith's
`image_name` (swesmith 0.0.9 harness/gather.py writes it, next to instance_id, repo, patch, FAIL_TO_PASS
and PASS_TO_PASS), and R2E-Gym's own columns (R2E-Gym's agenthub/runtime/docker.py reads them)."""


def detect_form(record: dict, *, where: str = "record") -> str:
    """The row's form (one of `FORMS`) from the fields it has; `swebench` when it has none of the
    telling fields (its own validation then names what is missing). Fields of two forms: FormError."""
    present = {form: [f for f in fields if record.get(f) is not None] for form, fields in MARKERS.items()}
    found = [form for form, fields in present.items() if fields]
    if len(found) > 1:
        parts = " and ".join(f"{FORM_NAMES[f]}'s {', '.join(present[f])}" for f in found)
        raise FormError(f"{where}: ambiguous row form: it has {parts}; a row must be in one published "
                        "schema (drop the other form's fields)")
    return found[0] if found else "swebench"


def convert_rows(records: list[Any], *, origin: str, indices: list[int] | None = None) -> list[Any]:
    """The records with every SWE-smith and R2E-Gym row made a SWE-bench-form record (SWE-bench rows and
    anything that is not a dict are left as they are, for `parse_instance` to judge). `indices`: the
    records' positions in their source, for the messages (default 0, 1, ...)."""
    indices = indices if indices is not None else list(range(len(records)))
    out = list(records)
    smith: list[int] = []
    for k, (i, rec) in enumerate(zip(indices, records, strict=True)):
        if not isinstance(rec, dict):
            continue
        form = detect_form(rec, where=_where(rec, i, origin))
        if form == "r2egym":
            out[k] = r2egym_record(rec, where=_where(rec, i, origin))
        elif form == "swesmith":
            _swesmith_fields(rec, _where(rec, i, origin))
            smith.append(k)
    if smith:
        answers = _run_oracle("swesmith", [_swesmith_request(records[k]) for k in smith])
        for k, answer in zip(smith, answers, strict=True):
            out[k] = swesmith_record(records[k], answer, where=_where(records[k], indices[k], origin))
    return out
