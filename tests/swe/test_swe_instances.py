"""Instance and predictions files: formats, schema validation, selection (no Docker needed)."""

from __future__ import annotations

import json

import pytest

from swerl.envs.swe.images import swebench_image_name
from swerl.envs.swe.instances import InstanceError, load_instances, load_predictions, parse_instance
from swerl.envs.swe.types import SWEInstance


def record(iid="acme__widgets-1", **over):
    r = {"instance_id": iid, "repo": "acme/widgets", "base_commit": "a" * 40, "patch": "diff --git a/x b/x\n",
         "test_patch": "", "problem_statement": "it breaks", "FAIL_TO_PASS": '["tests/t.py::test_a"]',
         "PASS_TO_PASS": ["tests/t.py::test_b", "tests/t.py::test_c"], "version": "1.0",
         "created_at": "2024-01-01T00:00:00Z", "environment_setup_commit": "b" * 40, "hints_text": "",
         # how to run the tests, as swerl's own rows say it (published rows get it from the specs)
         "test_cmd": "pytest -rA tests/t.py", "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail"}
    r.update(over)
    return r


def test_json_string_and_list_test_fields_parse_to_the_same_tuples():
    a = parse_instance(record(FAIL_TO_PASS='["t::a", "t::b"]', PASS_TO_PASS="[]"))
    b = parse_instance(record(FAIL_TO_PASS=["t::a", "t::b"], PASS_TO_PASS=[]))
    assert a.fail_to_pass == b.fail_to_pass == ("t::a", "t::b")
    assert a.pass_to_pass == () and a == b


def test_to_swebench_round_trips_with_json_encoded_test_lists():
    inst = parse_instance(record(split="train", test_cmd="pytest"))
    d = inst.to_swebench()
    assert json.loads(d["FAIL_TO_PASS"]) == ["tests/t.py::test_a"]
    assert isinstance(d["PASS_TO_PASS"], str)
    assert parse_instance(d) == inst


@pytest.mark.parametrize("field", ["instance_id", "repo", "base_commit", "patch", "test_patch",
                                   "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS"])
def test_missing_field_is_named(field):
    r = record()
    del r[field]
    with pytest.raises(InstanceError, match=r"acme__widgets-1|record 0") as e:
        parse_instance(r)
    assert repr(field) in str(e.value)


@pytest.mark.parametrize("field,value,needle", [
    ("FAIL_TO_PASS", "not json", "not JSON"),
    ("FAIL_TO_PASS", '{"a": 1}', "list of test-id strings"),
    ("PASS_TO_PASS", [1, 2], "list of test-id strings"),
    ("FAIL_TO_PASS", "[]", "empty"),
    ("base_commit", 123, "must be a string"),
    ("repo", "  ", "is empty"),
    ("version", 1.0, "must be a string"),
    ("eval_type", "sometimes", "eval_type"),
])
def test_malformed_field_is_named(field, value, needle):
    with pytest.raises(InstanceError, match=needle) as e:
        parse_instance(record(**{field: value}))
    assert field in str(e.value)


def test_local_json_jsonl_and_parquet_load_the_same_instances(tmp_path):
    import datasets

    rows = [record("acme__widgets-1", split="train"), record("acme__widgets-2", split="heldout"),
            record("other__thing-7", split="train")]
    (tmp_path / "a.json").write_text(json.dumps(rows))
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # parquet wants one type per column: the hub stores the test lists JSON-encoded
    flat = [{**r, "PASS_TO_PASS": json.dumps(r["PASS_TO_PASS"])} for r in rows]
    datasets.Dataset.from_list(flat).to_parquet(str(tmp_path / "a.parquet"))
    loaded = [load_instances(tmp_path / f"a.{ext}") for ext in ("json", "jsonl", "parquet")]
    assert loaded[0] == loaded[1] == loaded[2]
    assert [i.instance_id for i in loaded[0]] == ["acme__widgets-1", "acme__widgets-2", "other__thing-7"]
    assert all(isinstance(i, SWEInstance) for i in loaded[0])


def test_split_ids_filters_and_limit(tmp_path):
    rows = [record(f"acme__widgets-{n}", split="train" if n % 2 else "heldout") for n in range(1, 7)]
    path = tmp_path / "i.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [i.instance_id for i in load_instances(path, split="heldout")] == [
        "acme__widgets-2", "acme__widgets-4", "acme__widgets-6"]
    assert [i.instance_id
            for i in load_instances(path, instance_ids=["acme__widgets-5"])] == ["acme__widgets-5"]
    assert [i.instance_id for i in load_instances(path, filters=["*-1", "*-3"])] == [
        "acme__widgets-1", "acme__widgets-3"]
    assert len(load_instances(path, split="train", limit=2)) == 2
    with pytest.raises(InstanceError, match="acme__widgets-99"):
        load_instances(path, instance_ids=["acme__widgets-99"])


def test_bad_files_give_clear_errors(tmp_path):
    (tmp_path / "broken.jsonl").write_text(json.dumps(record()) + "\n{oops\n")
    with pytest.raises(InstanceError, match="line 2: not valid JSON"):
        load_instances(tmp_path / "broken.jsonl")
    (tmp_path / "obj.json").write_text('{"instance_id": "x"}')
    with pytest.raises(InstanceError, match="expected a JSON list"):
        load_instances(tmp_path / "obj.json")
    (tmp_path / "dup.jsonl").write_text(json.dumps(record()) + "\n" + json.dumps(record()) + "\n")
    with pytest.raises(InstanceError, match="appears twice"):
        load_instances(tmp_path / "dup.jsonl")
    with pytest.raises(FileNotFoundError):
        load_instances(tmp_path / "nope.jsonl")


def test_hub_ids_go_through_datasets_and_fail_clearly_offline(monkeypatch):
    import datasets

    seen = {}

    def fake_load_dataset(name, split=None, **kw):
        seen["args"] = (name, split)
        return [record("django__django-1")]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    got = load_instances("SWE-bench/SWE-bench_Verified")
    assert seen["args"] == ("SWE-bench/SWE-bench_Verified", "test")
    assert got[0].instance_id == "django__django-1"

    def offline(name, split=None, **kw):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(InstanceError, match=r"princeton-nlp/SWE-bench_Lite.*dev"):
        load_instances("princeton-nlp/SWE-bench_Lite", split="dev")


def test_predictions_json_jsonl_and_errors(tmp_path):
    preds = [{"instance_id": "a__b-1", "model_patch": "diff", "model_name_or_path": "m"},
             {"instance_id": "a__b-2", "model_patch": None, "model_name_or_path": "m"}]
    (tmp_path / "p.json").write_text(json.dumps(preds))
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(p) + "\n" for p in preds))
    (tmp_path / "map.json").write_text(json.dumps({p["instance_id"]: p for p in preds}))
    a, b, c = (load_predictions(tmp_path / n) for n in ("p.json", "p.jsonl", "map.json"))
    assert a == b == c and a[1].model_patch is None
    cases = [
        ('[{"model_patch": "x"}]', "entry 0: missing or non-string field 'instance_id'"),
        ('[{"instance_id": "a"}]', "missing field 'model_patch'"),
        ('[{"instance_id": "a", "model_patch": 3}]', "'model_patch' must be a string or null"),
        ('[{"instance_id": "a", "model_patch": "", "model_name_or_path": 1}]', "model_name_or_path"),
        ('[{"instance_id": "a", "model_patch": ""}, {"instance_id": "a", "model_patch": ""}]',
         "more than one"),
        ('"x"', "expected a JSON list"),
        ("[{", "not valid JSON"),
    ]
    for text, needle in cases:
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(InstanceError, match=needle.replace("(", r"\(")):
            load_predictions(tmp_path / "bad.json")
    (tmp_path / "p.txt").write_text("")
    with pytest.raises(InstanceError, match=r"\.json or \.jsonl"):
        load_predictions(tmp_path / "p.txt")


def test_swebench_image_name_rule():
    # SWE-bench's published images: `__` becomes `_1776_`, everything lower case
    assert (swebench_image_name("django__django-11099")
            == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest")
    assert swebench_image_name("Foo__Bar-1") == "swebench/sweb.eval.x86_64.foo_1776_bar-1:latest"


def test_eval_script_resets_graded_test_files_and_uses_swebench_markers():
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

    from swerl.envs.swe.grading import eval_script, graded_test_files, test_spec_for

    tp = ("diff --git a/tests/t_new.py b/tests/t_new.py\nnew file mode 100644\n--- /dev/null\n+++ "
          "b/tests/t_new.py\n")
    inst = parse_instance(record(test_patch=tp, test_cmd="python3 -m pytest -rA tests"))
    assert graded_test_files(inst) == ["tests/t_new.py", "tests/t.py"]
    script = eval_script(inst)
    assert script.index(f": '{START_TEST_OUTPUT}'") < script.index("python3 -m pytest -rA "
                                                                   "tests") < script.index(
        f": '{END_TEST_OUTPUT}'")
    assert script.count("git checkout -q") >= 2 and "conftest" in script and "git apply -v -" in script
    # swebench's make_test_spec adds its exit-code record after our end marker
    spec = test_spec_for(inst, "some-image")
    assert any("SWEBENCH_TEST_EXIT_CODE=$?" in ln for ln in spec.eval_script_list)
    with pytest.raises(ValueError, match="'eval_script' nor 'test_cmd'"):
        eval_script(parse_instance(record(test_cmd="")))
    with pytest.raises(ValueError, match="log_parser"):
        test_spec_for(parse_instance(record(test_cmd="x", log_parser="parse_log_nothing")), "img")
    own = parse_instance(record(eval_script="#!/bin/bash\necho mine\n"))
    assert eval_script(own) == "#!/bin/bash\necho mine\n"
