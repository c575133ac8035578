"""Loading and validating SWE-bench-style instances and predictions files.

Sources: a Hugging Face hub id (`SWE-bench/SWE-bench_Verified`, `princeton-nlp/SWE-bench_Lite`, ...),
loaded with `datasets`, or a local .json (a list), .jsonl or .parquet file, or a dataset saved with
`save_to_disk`. Rows in any published form are accepted: SWE-bench's (SWE-bench, Lite, Verified,
SWE-Gym), SWE-smith's and R2E-Gym's, told apart by their fields; the last two are made SWE-bench-form
records first (`swerl.envs.swe.forms`). Rows as published (no eval script, log parser, eval type or
image) are completed from SWE-bench's specs, or SWE-Gym's for its repositories
(`swerl.envs.swe.specs`). Every record is checked field by field; a bad record raises `InstanceError`
naming the record and the field.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from swerl.envs.swe.forms import FormError, convert_rows, detect_form
from swerl.envs.swe.specs import SpecError, complete_rows
from swerl.envs.swe.types import Prediction, SWEInstance

REQUIRED_STR = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement")
OPTIONAL_STR = ("version", "created_at", "environment_setup_commit", "hints_text", "image", "eval_script",
                "log_parser", "eval_type", "test_cmd", "source", "split", "setup_patch")
LOCAL_SUFFIXES = (".json", ".jsonl", ".parquet")


class InstanceError(ValueError):
    """An instance or predictions record is missing a field or has a malformed one."""


def _where(record: dict, index: int, origin: str) -> str:
    iid = record.get("instance_id") if isinstance(record, dict) else None
    return f"{origin} record {index}" + (f" ({iid})" if isinstance(iid, str) and iid else "")


def _test_list(value: Any, field: str, where: str) -> tuple[str, ...]:
    """FAIL_TO_PASS / PASS_TO_PASS: a list of test ids, or that list JSON-encoded (SWE-bench's hub form)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise InstanceError(f"{where}: field {field!r} is a string but not JSON ({e}); "
                                "expected a list of test ids or its JSON encoding") from None
    if hasattr(value, "tolist"):  # parquet may hand back numpy arrays
        value = value.tolist()
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) for t in value):
        raise InstanceError(f"{where}: field {field!r} must be a list of test-id strings, got "
                            f"{type(value).__name__}")
    return tuple(value)


def parse_instance(record: Any, *, index: int = 0, origin: str = "instance") -> SWEInstance:
    """Validate one record (a dict in any published form: a SWE-smith or R2E-Gym row is converted
    first) and build the `SWEInstance`."""
    where = f"{origin} record {index}"
    if not isinstance(record, dict):
        raise InstanceError(f"{where}: expected an object with SWE-bench fields, got {type(record).__name__}")
    where = _where(record, index, origin)
    try:
        if detect_form(record, where=where) != "swebench":
            (record,) = convert_rows([record], origin=origin, indices=[index])
    except (FormError, SpecError) as e:
        raise InstanceError(str(e)) from None
    kw: dict[str, Any] = {}
    for field in REQUIRED_STR:
        if field not in record or record[field] is None:
            raise InstanceError(f"{where}: missing required field {field!r}")
        if not isinstance(record[field], str):
            raise InstanceError(f"{where}: field {field!r} must be a string, got "
                                f"{type(record[field]).__name__}")
        kw[field] = record[field]
    for field in ("instance_id", "repo", "base_commit"):
        if not kw[field].strip():
            raise InstanceError(f"{where}: field {field!r} is empty")
    for field in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        if field not in record or record[field] is None:
            raise InstanceError(f"{where}: missing required field {field!r}")
        kw[field.lower()] = _test_list(record[field], field, where)
    if not kw["fail_to_pass"]:
        raise InstanceError(f"{where}: field 'FAIL_TO_PASS' is empty: an instance needs at least one test to "
                            "fix")
    for field in OPTIONAL_STR:
        v = record.get(field)
        if v is None or v == "":
            continue
        if not isinstance(v, str):
            raise InstanceError(f"{where}: field {field!r} must be a string, got {type(v).__name__}")
        kw[field] = v
    try:
        return SWEInstance(**kw)
    except ValueError as e:
        raise InstanceError(f"{where}: {e}") from None


def _read_local(path: Path) -> list[Any]:
    if not path.exists():
        raise FileNotFoundError(f"instance file {path} does not exist")
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise InstanceError(f"{path}: not valid JSON ({e})") from None
        if isinstance(data, dict) and isinstance(data.get("instances"), list):
            data = data["instances"]
        if not isinstance(data, list):
            raise InstanceError(f"{path}: expected a JSON list of instances, got {type(data).__name__}")
        return data
    if path.suffix == ".jsonl":
        rows = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise InstanceError(f"{path} line {n}: not valid JSON ({e})") from None
        return rows
    import datasets  # parquet goes through the same library as hub datasets

    return list(datasets.load_dataset("parquet", data_files=str(path), split="train"))


def _read_saved(path: Path, split: str | None) -> tuple[list[Any], bool]:
    """A dataset written by `save_to_disk`: a DatasetDict (its split chosen here, default `test`)
    or one Dataset (filtered on a `split` column later, like a file). Returns the rows and whether
    the split was already applied."""
    import datasets

    data = datasets.load_from_disk(str(path))
    if isinstance(data, datasets.DatasetDict):
        want = split or "test"
        if want not in data:
            raise InstanceError(f"{path}: no split {want!r} — the splits present are "
                                f"{', '.join(sorted(data))}")
        return list(data[want]), True
    return list(data), False


def _read_hub(name: str, split: str) -> list[Any]:
    import datasets

    try:
        return list(datasets.load_dataset(name, split=split))
    except Exception as e:  # the hub, the cache and the network all fail in their own ways
        raise InstanceError(f"could not load dataset {name!r} split {split!r} from the hub or its cache: "
                            f"{e}. "
                            "Pass a local .json/.jsonl/.parquet file instead.") from e


def load_instances(source: str | Path, *, split: str | None = None, instance_ids: Sequence[str] | None = None,
                   filters: Sequence[str] = (), limit: int | None = None) -> list[SWEInstance]:
    """Load and validate instances.

    source: a hub id, a local file (.json list, .jsonl, .parquet), a dataset saved with
      `save_to_disk`, or a directory holding `instances.jsonl`. split: for hub ids the dataset split
      (default `test`); for local files, keep only records whose `split` field equals it.
      instance_ids: keep exactly these (unknown ids are an error). filters: shell-style patterns on
      instance_id (`toolz__*`); an instance is kept when any matches. limit: keep the first N after
      filtering.
    """
    path = Path(source)
    origin = str(source)
    saved = path.is_dir() and ((path / "dataset_dict.json").is_file() or (path / "state.json").is_file())
    if path.is_dir() and not saved:
        path = path / "instances.jsonl"
    if saved:
        records, split_done = _read_saved(path, split)
        local = not split_done
    elif path.suffix in LOCAL_SUFFIXES or path.exists():
        records = _read_local(path)
        local = True
    else:
        records = _read_hub(str(source), split or "test")
        local = False
    try:  # SWE-smith and R2E-Gym rows become SWE-bench-form records (SWE-bench rows are kept)
        records = convert_rows(records, origin=origin)
    except (FormError, SpecError) as e:
        raise InstanceError(str(e)) from None
    for i, r in enumerate(records):  # the row's own fields first: a malformed row is named as such
        parse_instance(r, index=i, origin=origin)
    try:  # rows as published lack how to run their tests: SWE-bench's specs say it
        records = complete_rows(records, origin=origin)
    except SpecError as e:
        raise InstanceError(str(e)) from None
    instances = [parse_instance(r, index=i, origin=origin) for i, r in enumerate(records)]
    seen: set[str] = set()
    for inst in instances:
        if inst.instance_id in seen:
            raise InstanceError(f"{origin}: instance_id {inst.instance_id!r} appears twice")
        seen.add(inst.instance_id)
    if local and split:
        present = sorted({i.split for i in instances if i.split})
        if split not in present:
            raise InstanceError(f"{origin}: no split {split!r} — the splits present are "
                                f"{', '.join(present) if present else 'none (no record has a split field)'}")
        instances = [i for i in instances if i.split == split]
    if instance_ids:
        missing = sorted(set(instance_ids) - {i.instance_id for i in instances})
        if missing:
            raise InstanceError(f"{origin}: instance ids not found{f' in split {split!r}' if split else ''}: "
                                f"{', '.join(missing)}")
        wanted = set(instance_ids)
        instances = [i for i in instances if i.instance_id in wanted]
    if filters:
        instances = [i for i in instances if any(fnmatch.fnmatchcase(i.instance_id, f) for f in filters)]
    if limit is not None:
        instances = instances[:limit]
    return instances


def write_instances(instances: Iterable[SWEInstance], path: Path) -> None:
    """Write instances as SWE-bench JSONL (atomically)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(i.to_swebench()) + "\n" for i in instances))
    tmp.replace(path)


def load_predictions(path: str | Path) -> list[Prediction]:
    """A SWE-bench predictions file: a .json list (or {id: prediction} map) or .jsonl of
    {instance_id, model_patch, model_name_or_path}. Errors name the entry and the field."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"predictions file {path} does not exist")
    text = path.read_text()
    if path.suffix == ".jsonl":
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise InstanceError(f"predictions {path} line {n}: not valid JSON ({e})") from None
    elif path.suffix == ".json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise InstanceError(f"predictions {path}: not valid JSON ({e})") from None
        if isinstance(rows, dict):  # SWE-agent writes {instance_id: prediction}
            rows = list(rows.values())
        if not isinstance(rows, list):
            raise InstanceError(f"predictions {path}: expected a JSON list of predictions, got "
                                f"{type(rows).__name__}")
    else:
        raise InstanceError(f"predictions {path}: must end in .json or .jsonl")
    preds: list[Prediction] = []
    seen: set[str] = set()
    for i, row in enumerate(rows):
        where = f"predictions {path} entry {i}"
        if not isinstance(row, dict):
            raise InstanceError(f"{where}: expected an object, got {type(row).__name__}")
        iid = row.get("instance_id")
        if not isinstance(iid, str) or not iid:
            raise InstanceError(f"{where}: missing or non-string field 'instance_id'")
        if "model_patch" not in row:
            raise InstanceError(f"{where} ({iid}): missing field 'model_patch'")
        patch = row["model_patch"]
        if patch is not None and not isinstance(patch, str):
            raise InstanceError(f"{where} ({iid}): field 'model_patch' must be a string or null, "
                                f"got {type(patch).__name__}")
        name = row.get("model_name_or_path", "")
        if not isinstance(name, str):
            raise InstanceError(f"{where} ({iid}): field 'model_name_or_path' must be a string")
        if iid in seen:
            raise InstanceError(f"{where}: instance_id {iid!r} has more than one prediction")
        seen.add(iid)
        preds.append(Prediction(instance_id=iid, model_patch=patch, model_name_or_path=name))
    return preds
