"""What `bench scaling` leaves and shows: no model dirs, a line per run, one colour per
series, a table within 100 columns. No process starts: the runs are fakes."""

import os

import pytest

from tests.bench.test_scaling_control import _args, _fake_bench, _fake_result
from tfdist.bench import runs, scaling


def _one_run_writing(tmp_path, monkeypatch, keep=False):
    """one_run with runs.run replaced by a fake that writes what a trainer leaves."""
    seen = {}

    def run(cmd, timeout_s, env, what):
        model_dir = cmd[cmd.index("--model-dir") + 1]
        os.makedirs(os.path.join(model_dir, "backup"))
        for name in ("model.keras", "metrics.json", "backup/ckpt-0000000010.npz"):
            open(os.path.join(model_dir, name), "w").close()
        seen["model_dir"] = model_dir
        return [_fake_result(8, 0.1)]

    monkeypatch.setattr(runs, "run", run)
    args = _args(tmp_path)
    args.keep_runs = keep  # `--keep-runs`, a flag of every subcommand (tfdist.bench.__main__)
    result = scaling.one_run(args, "wide_mlp", "shm", 2, 16, "wide_mlp_shm_weak_2_r0")
    assert result["examples_per_s"] == pytest.approx(80.0)
    return seen["model_dir"]


def test_a_run_leaves_no_model_or_backup_behind(tmp_path, monkeypatch):
    model_dir = _one_run_writing(tmp_path, monkeypatch)
    assert model_dir == str(tmp_path / "runs" / "wide_mlp_shm_weak_2_r0")
    assert not os.path.exists(model_dir) and not (tmp_path / "runs").exists()


def test_keep_runs_keeps_them(tmp_path, monkeypatch):
    model_dir = _one_run_writing(tmp_path, monkeypatch, keep=True)
    assert sorted(os.listdir(model_dir)) == ["backup", "metrics.json", "model.keras"]


def test_a_line_per_run_while_it_runs(tmp_path, monkeypatch, capsys):
    _fake_bench(monkeypatch, [180.0, 170.0])
    scaling.run(_args(tmp_path, flags=["--repeats", "2"]))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == ("scaling: 6 runs of 10 steps: wide_mlp; weak; 1..2 workers; shm; "
                        "control; 2 repeats")
    assert [line.split(" wide_mlp ")[0] for line in lines[1:]] == [
        f"[{i}/6]" for i in range(1, 7)]
    assert lines[2].startswith("[2/6] wide_mlp weak, repeat 1/2: control, 2 workers alone: "
                               "180 examples/s (")
    assert lines[6].startswith("[6/6] wide_mlp weak, repeat 2/2: shm, 2 workers: 153 examples/s")


def _two_series(tmp_path, monkeypatch):
    """Two recipes, two engines (with fp16), both modes, the control: every panel full."""
    _fake_bench(monkeypatch, [180.0] * 8)
    args = _args(tmp_path, flags=["--recipes", "wide_mlp,synthetic_cnn", "--modes",
                                  "weak,strong", "--strategies", "multi_worker,shm",
                                  "--grad-compression", "none,fp16"])
    return scaling.run(args)


def test_each_series_has_one_colour_in_every_panel(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    result = _two_series(tmp_path, monkeypatch)
    # A point above 1 in one panel only: its red ring once advanced that panel's colour cycle.
    result["results"]["wide_mlp"]["shm"]["weak"]["noise"] = [False, True]
    fig = Figure()
    scaling.plot(result, fig)
    assert len(fig.axes) == 4
    colours = {}
    for ax in fig.axes:
        for container in ax.containers:
            label = container.get_label()
            if "control" not in label:
                colours.setdefault(label, set()).add(container.lines[0].get_color())
    assert len(colours) == 8  # 2 recipes x (multi_worker, shm) x (none, fp16)
    assert all(len(c) == 1 for c in colours.values()), colours
    assert len({next(iter(c)) for c in colours.values()}) == 8  # and no two alike


def test_table_fits_100_columns(tmp_path, monkeypatch):
    result = _two_series(tmp_path, monkeypatch)
    out = scaling.table(result)
    assert max(len(line) for line in out.splitlines()) <= scaling.TABLE_WIDTH, out
    assert "synthetic_cnn, strong scaling" in out and "multi_worker+fp16" in out
    # With --hosts: the prediction's two columns instead of the control's one.
    for curves in result["results"].values():
        for by_mode in curves.values():
            for c in by_mode.values():
                c.update(predicted_step_s=c["step_s"], predicted_efficiency=c["efficiency"])
                for key in [k for k in c if "control" in k]:
                    del c[key]
    hosts = {**result, "controls": {}, "link_gbs": 0.125, "rate": "1gbit"}
    out = scaling.table(hosts)
    assert "pred eff" in out and "vs ctrl" not in out
    assert max(len(line) for line in out.splitlines()) <= scaling.TABLE_WIDTH, out
