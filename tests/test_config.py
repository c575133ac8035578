"""Typed configs: YAML + dotted overrides, unknown keys and wrong types are errors, docstrings are help."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from swerl.config import ConfigError, field_docs, help_text, load
from swerl.structs import SandboxSpec


@dataclass(frozen=True)
class Inner:
    lr: float = 1e-6
    """Learning rate."""
    steps: int = 10
    """Number of steps."""

    def __post_init__(self) -> None:
        if self.steps <= 0:
            raise ValueError(f"steps must be > 0, got {self.steps}")


@dataclass(frozen=True)
class Outer:
    name: str = "run"
    """Run name."""
    inner: Inner = field(default_factory=Inner)
    sandbox: SandboxSpec = field(default_factory=SandboxSpec)
    tags: tuple[str, ...] = ()
    """Free-form tags."""
    budget: float | None = None
    """Optional budget."""


def test_yaml_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: exp1\ninner:\n  lr: 3.0e-6\nsandbox:\n  memory: 1g\n  pids: 128\ntags: [a, b]\n")
    cfg = load(Outer, p, ["inner.steps=5", "sandbox.network=bridge", "budget=2"])
    assert cfg == Outer(name="exp1", inner=Inner(lr=3e-6, steps=5), tags=("a", "b"), budget=2.0,
                        sandbox=SandboxSpec(memory="1g", pids=128, network="bridge"))


@dataclass(frozen=True)
class Deep:
    inner: Inner = field(default_factory=lambda: Inner(lr=0.5, steps=7))


@dataclass(frozen=True)
class Top:
    deep: Deep = field(default_factory=Deep)
    inner: Inner = field(default_factory=lambda: Inner(lr=2.0, steps=3))


def test_a_section_given_in_part_keeps_its_parents_default_for_the_rest(tmp_path):
    # Top's default inner is Inner(lr=2.0, steps=3), not Inner's own (1e-6, 10)
    assert load(Top, None, ["inner.steps=4"]).inner == Inner(lr=2.0, steps=4)
    assert load(Top, None, ["deep.inner.lr=0.25"]).deep.inner == Inner(lr=0.25, steps=7)
    p = tmp_path / "c.yaml"
    p.write_text("inner: {lr: 1.0}\ndeep: {}\n")
    assert load(Top, p) == Top(deep=Deep(inner=Inner(lr=0.5, steps=7)), inner=Inner(lr=1.0, steps=3))
    with pytest.raises(ConfigError, match="steps must be > 0"):  # the merged section is still checked
        load(Top, None, ["deep.inner.steps=0"])


def test_unknown_key_is_an_error_naming_it_and_the_valid_keys(tmp_path):
    with pytest.raises(ConfigError, match=r"inner\.stpes.*valid keys.*lr, steps"):
        load(Outer, None, ["inner.stpes=3"])
    with pytest.raises(ConfigError, match=r"sandbox\.memroy"):
        load(Outer, None, ["sandbox.memroy=1g"])


def test_wrong_types_and_invariants_are_errors():
    with pytest.raises(ConfigError, match=r"inner\.steps: expected int"):
        load(Outer, None, ["inner.steps=many"])
    with pytest.raises(ConfigError, match="steps must be > 0"):
        load(Outer, None, ["inner.steps=0"])
    with pytest.raises(ConfigError, match=r"sandbox.*pids must be >= 16"):
        load(Outer, None, ["sandbox.pids=2"])
    with pytest.raises(ConfigError, match=r"key\.sub=value"):
        load(Outer, None, ["noequals"])


@pytest.mark.parametrize(("text", "value"), [
    ("1e-6", 1e-6), ("5e-7", 5e-7), (".5", 0.5), ("-1E+3", -1000.0), ("2", 2.0), ("3.0e-6", 3e-6),
    ("1_000.5", 1000.5), ('"1e-6"', 1e-6),  # quoted: a string that is a number still fits a float field
])
def test_floats_as_people_write_them(tmp_path, text, value):
    assert load(Outer, None, [f"inner.lr={text}"]).inner.lr == value
    p = tmp_path / "c.yaml"
    p.write_text(f"inner:\n  lr: {text}\n")
    assert load(Outer, p).inner.lr == value


def test_a_scalar_into_a_string_field_is_its_text(tmp_path):
    # YAML reads these as int / float / bool; a string field takes them as written
    for text in ("007", "2024", "1e-6", "yes", "3.10"):
        assert load(Outer, None, [f"name={text}"]).name == text
        assert load(Outer, None, [f"tags=[{text}, b]"]).tags == (text, "b")
    p = tmp_path / "c.yaml"
    p.write_text("name: 3.10\ntags: [1, true]\nsandbox: {memory: 2048}\n")
    cfg = load(Outer, p)
    assert (cfg.name, cfg.tags, cfg.sandbox.memory) == ("3.10", ("1", "true"), "2048")
    assert load(Outer, None, ["budget=null"]).budget is None  # null stays None where None is allowed
    with pytest.raises(ConfigError, match=r"inner\.lr: expected a number, got 'fast'"):
        load(Outer, None, ["inner.lr=fast"])
    with pytest.raises(ConfigError, match=r"inner\.steps: expected int, got 1\.5"):
        load(Outer, None, ["inner.steps=1.5"])


def test_invalid_yaml_is_a_config_error(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load(Outer, p)
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(Outer, None, ["tags=[a, b"])


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load(Outer, tmp_path / "nope.yaml")


def test_field_docstrings_are_the_help_text():
    assert field_docs(Inner) == {"lr": "Learning rate.", "steps": "Number of steps."}
    rows = {k: (d, doc) for k, d, doc in help_text(Outer)}
    assert rows["inner.lr"] == ("1e-06", "Learning rate.")
    assert rows["sandbox.pids"][1].startswith("Maximum number of processes")
    assert all(doc for k, (_, doc) in rows.items()
               if k.startswith("sandbox.")), "every SandboxSpec field has a doc"


def test_shipped_sandbox_config_matches_the_defaults():
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert load(SandboxSpec, os.path.join(root, "configs", "sandbox_default.yaml")) == SandboxSpec()
