"""Training-run dashboards: reading metrics.jsonl, the EMA, `swerl plot` (one figure, runs overlaid) and
`swerl compare` (final / best of the headline metrics), on hand-written runs with hand-known answers."""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET

import pytest

from swerl.cli import main
from swerl.runlog import PANELS, build_figure, compare_runs, ema, plot_runs, read_run, read_runs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# Two runs of 10 steps, evaluated on steps 5 and 10. Only "aem" logs aem/ keys; neither logs actfocus/.
GRPO_REWARD = [0.1, 0.2, 0.3, None, 0.4, 0.5, 0.4, 0.6, 0.7, 0.6]  # None: a NaN the writer stored as null
AEM_REWARD = [0.1, 0.3, 0.3, 0.5, 0.5, 0.6, 0.8, 0.7, 0.8, 0.75]
GRPO_STEP_S = [12.0, 11.0, None, 10.0, 14.0, 10.0, 9.0, 9.0, 9.5, 13.0]
AEM_STEP_S = [13.0, 12.0, 12.0, 11.0, 15.0, 11.5, 11.0, 10.5, 10.5, 16.0]
VAL = {"grpo": {5: (0.25, 0.3), 10: (0.5, 0.6)}, "aem": {5: (0.5, 0.55), 10: (0.25, 0.35)}}


def _rows(name):
    reward = GRPO_REWARD if name == "grpo" else AEM_REWARD
    step_s = GRPO_STEP_S if name == "grpo" else AEM_STEP_S
    rows = []
    for i in range(10):
        s = i + 1
        row = {"train_step": s, "reward/mean": reward[i], "reward/success_rate": reward[i],
               "actor/entropy": 2.0 - 0.1 * s, "actor/approx_kl": 1e-3 * s,
               "actor/clipfrac_low": 0.01, "actor/clipfrac_high": 0.02,
               "rollout/seq_len_mean": 800.0 + 10 * s, "rollout/turns_mean": 5.0 + 0.1 * s,
               "timing_s/rollout": 7.0, "timing_s/learn": 2.0, "timing_s/sync": 0.5,
               "timing_s/step": step_s[i], "flag": True}
        if name == "grpo":
            row["actor/kl"] = None  # logged but undefined on every step: no finite value
        if name == "aem":
            row |= {"aem/alpha_mean": 1.0, "aem/alpha_min": 0.8 - 0.01 * s, "aem/alpha_max": 1.2 + 0.01 * s}
        if s in VAL[name]:
            sr, rm = VAL[name][s]
            row |= {"val/success_rate": sr, "val/reward_mean": rm, "val/pass@1": sr, "val/pass@2": sr + 0.1,
                    "val/pass@10": sr + 0.3, "val/pass@4": sr + 0.25,
                    "timing_s/eval": 3.0}
        rows.append(row)
    return rows


def _write(run_dir, rows, tail=""):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return run_dir


@pytest.fixture
def two_runs(tmp_path):
    # a torn last line, as a killed run leaves it
    return [_write(tmp_path / n, _rows(n), tail='{"train_step": 11, "rew') for n in ("grpo", "aem")]


# ---- reading ---------------------------------------------------------------------------------------


def test_read_run_skips_torn_lines_and_keeps_the_last_row_of_a_step(tmp_path):
    _write(tmp_path / "r", [{"train_step": 2, "x": 1}, {"train_step": 1, "x": 2}, {"no_step": 1},
                            {"train_step": "3"}, {"train_step": 2, "x": 3}], tail='{"train_st')
    run = read_run(tmp_path / "r")
    assert run.name == "r" and run.steps == (1, 2)
    assert [r["x"] for r in run.rows] == [2, 3]


def test_read_run_series_gaps_and_absent_steps(two_runs):
    grpo = read_run(two_runs[0])
    assert grpo.steps == tuple(range(1, 11))
    steps, values = grpo.series("reward/mean")
    assert steps == list(range(1, 11)) and math.isnan(values[3]) and values[4] == 0.4
    assert grpo.series("val/success_rate") == ([5, 10], [0.25, 0.5])  # only where it was logged
    assert not grpo.has("actor/kl") and not grpo.has("aem/alpha_mean") and grpo.has("actor/entropy")
    assert not grpo.has("flag")  # a bool is a flag, not a curve


def test_read_run_missing_or_empty(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"a training run writes <run_dir>/metrics\.jsonl"):
        read_run(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=r"no metrics file at .*metrics\.jsonl"):
        read_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="has no metrics rows"):
        read_run(tmp_path)


def test_same_directory_names_are_told_apart_by_their_parent(tmp_path):
    a = _write(tmp_path / "a" / "run", [{"train_step": 1}])
    b = _write(tmp_path / "b" / "run", [{"train_step": 1}])
    c = _write(tmp_path / "other", [{"train_step": 1}])
    assert [r.name for r in read_runs([a, b, c])] == ["a/run", "b/run", "other"]
    # the same parent name too: one more level
    d = _write(tmp_path / "x" / "a" / "run", [{"train_step": 1}])
    assert [r.name for r in read_runs([a, d])] == [f"{tmp_path.name}/a/run", "x/a/run"]
    with pytest.raises(ValueError, match="given twice"):
        read_runs([a, tmp_path / "a" / ".." / "a" / "run"])


# ---- the EMA ---------------------------------------------------------------------------------------


def _same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert (math.isnan(g) and math.isnan(w)) or g == pytest.approx(w)


def test_ema_by_hand():
    # s0 = 0; s1 = 0.5·0 + 0.5·1 = 0.5; s2 = 0.5·0.5 + 0.5·1 = 0.75
    _same(ema([0, 1, 1], 0.5), [0.0, 0.5, 0.75])
    # the gap is NaN and the state (0) carries over it: s2 = 0.5·0 + 0.5·1 = 0.5
    _same(ema([0, None, 1], 0.5), [0.0, math.nan, 0.5])
    # a leading gap: the average starts at the first value; s2 = 0.75·2 + 0.25·6 = 3
    _same(ema([float("nan"), 2, 6], 0.75), [math.nan, 2.0, 3.0])
    _same(ema([3, None, 1], 0.0), [3.0, math.nan, 1.0])
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="smoothing"):
            ema([1.0], bad)


# ---- compare ---------------------------------------------------------------------------------------


def test_compare_final_and_best(two_runs):
    rows = {(r.metric, r.run): r for r in compare_runs(two_runs)}
    r = rows["reward/mean", "grpo"]
    assert (r.final, r.best, r.best_step) == (0.6, 0.7, 9)
    r = rows["reward/mean", "aem"]
    assert (r.final, r.best, r.best_step) == (0.75, 0.8, 7)  # 0.8 again at step 9: the first one counts
    r = rows["val/success_rate", "grpo"]
    assert (r.final, r.best, r.best_step) == (0.5, 0.5, 10)
    r = rows["val/success_rate", "aem"]
    assert (r.final, r.best, r.best_step) == (0.25, 0.5, 5)
    r = rows["val/reward_mean", "aem"]
    assert (r.final, r.best, r.best_step) == (0.35, 0.55, 5)
    r = rows["timing_s/step", "grpo"]  # lower is better
    assert (r.final, r.best, r.best_step) == (13.0, 9.0, 7)
    r = rows["timing_s/step", "aem"]
    assert (r.final, r.best, r.best_step) == (16.0, 10.5, 8)
    r = rows["actor/entropy", "aem"]  # no better direction: the final value only
    assert r.final == pytest.approx(1.0) and r.best is None and r.best_step is None
    r = rows["actor/kl", "grpo"]  # only nulls
    assert r.final is None and r.best is None
    assert rows["actor/kl", "aem"].final is None  # never logged
    assert [m for m, run in rows if run == "grpo"] == [
        "reward/mean", "reward/success_rate", "val/success_rate", "val/reward_mean", "actor/entropy",
        "actor/kl", "rollout/seq_len_mean", "timing_s/step"]


def test_compare_cli_json_and_table(two_runs, capsys):
    assert main(["compare", *map(str, two_runs), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in out["runs"]] == ["grpo", "aem"] and out["runs"][0]["last_step"] == 10
    m = {(r["metric"], r["run"]): r for r in out["metrics"]}
    assert m["reward/mean", "aem"] == {"metric": "reward/mean", "run": "aem", "final": 0.75, "best": 0.8,
                                       "best_step": 7}
    assert m["actor/kl", "grpo"]["final"] is None
    assert main(["compare", *map(str, two_runs)]) == 0
    table = capsys.readouterr().out
    assert "grpo" in table and "aem" in table and "0.6 (0.7 @9)" in table and "16 (10.5 @8)" in table


# ---- the figure ------------------------------------------------------------------------------------


def _panel(fig, title):
    return next(ax for ax in fig.axes if ax.get_title() == title)


def _texts(ax):
    return [t.get_text().replace("\n", " ") for t in ax.texts]  # empty-panel texts are wrapped


def test_figure_panels_legend_and_empty_messages(two_runs):
    fig = build_figure(read_runs(two_runs), smooth=0.6)
    assert [t.get_text() for t in fig.subfigs[0].legends[0].get_texts()] == ["grpo", "aem"]
    assert "grpo" in fig.get_suptitle() and "aem" in fig.get_suptitle()
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == [p.title for p in PANELS]
    # nobody ran ActFocus: its panels say why they are empty and draw nothing
    weights = _panel(fig, "ActFocus weights")
    assert _texts(weights) == ["ActFocus off in these runs (no actfocus/weight_* metrics)"]
    assert not weights.lines
    assert "ActFocus off" in _texts(_panel(fig, "energy diagnostic"))[0]
    # AEM ran in one run: a band and curves for it, and a note naming the run without data
    aem = _panel(fig, "AEM α range")
    assert _texts(aem) == ["no data: grpo"]
    assert len(aem.collections) == 1 and {ln.get_color() for ln in aem.lines} == {"C1"}
    # train curves: raw (faint) + smoothed per run; the raw one ends at the logged value
    ent = _panel(fig, "policy entropy")
    assert len(ent.lines) == 4 and [ln.get_alpha() for ln in ent.lines[:2]] == [0.25, None]
    assert list(ent.lines[0].get_xdata()) == list(range(1, 11))
    # val: points on the evaluation steps only, the smallest and largest pass@k found in the rows, a key
    # legend
    val = _panel(fig, "held-out (val)")
    assert all(list(ln.get_xdata()) == [5, 10] for ln in val.lines) and len(val.lines) == 2 * 4
    assert [t.get_text() for t in val.get_legend().get_texts()] == [
        "val/success_rate", "val/reward_mean", "val/pass@1", "val/pass@10"]
    # timing_s/eval exists on steps 5 and 10 only, and timing curves are all drawn
    assert len(_panel(fig, "time per step").lines) == 2 * 2 * 4
    fig.canvas.draw()
    for ax in fig.axes:
        if ax.lines:
            assert ax.get_xlabel() == "train step"
            labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
            assert labels and all(re.fullmatch(r"[−-]?\d+", s) for s in labels), labels


def test_figure_empty_val_and_short_run_ticks(tmp_path):
    # 3 steps: a plain locator would put ticks at 1.25, 1.5, ...
    run = _write(tmp_path / "short", [{"train_step": s, "reward/mean": 0.1 * s} for s in (1, 2, 3)])
    fig = build_figure(read_runs([run]), smooth=0.0)
    assert _texts(_panel(fig, "held-out (val)")) == ["no val/ metrics: set eval_every"]
    assert _texts(_panel(fig, "AEM α range")) == ["AEM off in these runs (no aem/ metrics)"]
    assert _texts(_panel(fig, "KL")) == ["no data for actor/kl, actor/approx_kl"]
    reward = _panel(fig, "reward / success (train)")
    assert len(reward.lines) == 1 and reward.lines[0].get_alpha() is None  # smooth 0: the raw curve only
    fig.canvas.draw()
    labels = [t.get_text() for t in reward.get_xticklabels() if t.get_text()]
    assert {"1", "2", "3"} <= set(labels) and all(s.isdigit() for s in labels), labels


def test_plot_runs_png_and_svg(two_runs, tmp_path):
    png = plot_runs(two_runs, tmp_path / "out" / "d.png")
    assert png == tmp_path / "out" / "d.png" and png.read_bytes()[:8] == PNG_MAGIC
    svg = plot_runs(two_runs, tmp_path / "d", fmt="svg")  # the suffix is added
    assert svg.name == "d.svg"
    text = " ".join(e.text or "" for e in ET.parse(svg).iter() if e.tag.endswith("}text") or e.tag == "text")
    assert "grpo" in text and "aem" in text and "set eval_every" not in text
    with pytest.raises(ValueError, match=r"does not end in \.png"):
        plot_runs(two_runs, tmp_path / "d.svg")


# ---- the command -----------------------------------------------------------------------------------


def test_plot_cli_one_run_default_out(two_runs, capsys):
    assert main(["plot", str(two_runs[0])]) == 0
    out = two_runs[0] / "plots" / "dashboard.png"
    assert capsys.readouterr().out.strip() == str(out)
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_plot_cli_several_runs(two_runs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["plot", *map(str, two_runs), "--format", "svg", "--smooth", "0.3"]) == 0
    assert capsys.readouterr().out.strip() == "dashboard.svg"
    assert (tmp_path / "dashboard.svg").read_text().lstrip().startswith("<?xml")
    assert main(["plot", *map(str, two_runs), "--out", str(tmp_path / "x" / "both.png")]) == 0
    assert (tmp_path / "x" / "both.png").read_bytes()[:8] == PNG_MAGIC


def test_cli_errors(two_runs, tmp_path, capsys):
    for cmd in ("plot", "compare"):
        assert main([cmd, str(two_runs[0]), str(tmp_path / "missing")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("swerl: error: no run directory at") and "metrics.jsonl" in err
        assert len(err.strip().splitlines()) == 1
    assert main(["plot", str(two_runs[0]), "--smooth", "1"]) == 2
    assert "smoothing must be in [0, 1)" in capsys.readouterr().err


def test_plot_help_shows_defaults(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plot", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "(default: 0.6)" in out and "(default: png)" in out and "None" not in out


# ---- seeds of one arm as one curve -----------------------------------------------------------------


def test_seed_group_names():
    from pathlib import Path

    from swerl.runlog import seed_group

    assert seed_group(Path("/r/aem/seed2")) == Path("/r/aem") == seed_group(Path("/r/aem/s0"))
    assert seed_group(Path("/r/aem/3")) == Path("/r/aem")
    assert seed_group(Path("/r/aem-seed1")) == Path("/r/aem") == seed_group(Path("/r/aem_s12"))
    assert seed_group(Path("/r/aem")) is None and seed_group(Path("/r/seedless")) is None


def test_merged_seeds_are_the_mean_with_a_min_max_band(tmp_path, capsys):
    from swerl.runlog import merge_seeds

    def rows(rewards, val):
        return [{"train_step": s + 1, "reward/mean": r, **({"val/success_rate": val} if s == 1 else {})}
                for s, r in enumerate(rewards)]

    a0 = _write(tmp_path / "aem" / "seed0", rows([0.0, 0.5, 1.0], 0.25))
    a1 = _write(tmp_path / "aem" / "seed1", rows([0.5, 0.0, None], 0.75))
    a2 = _write(tmp_path / "aem" / "seed2", rows([1.0, 1.0], 0.5))  # stopped after step 2
    plain = _write(tmp_path / "grpo", rows([0.2, 0.4, 0.6], 0.1))
    runs = merge_seeds(read_runs([a0, plain, a1, a2]))
    assert [r.name for r in runs] == ["aem (3 seeds)", "grpo"]
    arm = runs[0]
    # steps every seed logged (1, 2); step 2: rewards 0.5, 0, 1 → mean 0.5, band [0, 1]
    assert arm.steps == (1, 2)
    assert arm.series("reward/mean") == ([1, 2], [0.5, 0.5])
    assert arm.series("reward/mean:min")[1] == [0.0, 0.0] and arm.series("reward/mean:max")[1] == [1.0, 1.0]
    assert arm.series("val/success_rate") == ([2], [0.5])
    assert runs[1].series("reward/mean")[1] == [0.2, 0.4, 0.6]  # a run without a seed stays as it is
    # the dashboard shades each arm's band under its curve; compare reports the mean curve
    fig = build_figure(runs, smooth=0)
    reward = _panel(fig, "reward / success (train)")
    assert len(reward.collections) == 1 and len(_panel(fig, "held-out (val)").collections) == 1
    assert main(["compare", str(a0), str(a1), str(a2), "--seeds", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    m = {(r["metric"], r["run"]): r for r in out["metrics"]}
    assert m["reward/mean", "aem (3 seeds)"]["final"] == 0.5
    assert main(["plot", str(a0), str(a1), str(a2), str(plain), "--seeds", "--out",
                 str(tmp_path / "arms.png")]) == 0
    assert (tmp_path / "arms.png").read_bytes().startswith(PNG_MAGIC)
