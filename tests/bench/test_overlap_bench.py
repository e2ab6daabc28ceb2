"""`bench overlap` (#31): its arithmetic, checks, table and plot (no process started)."""

from __future__ import annotations

import argparse

import pytest

from tfdist import compression
from tfdist.bench import overlap


def test_configurations_give_horovod_one_row_per_compression():
    got = overlap.configurations(["multi_worker", "horovod"], ["none", "fp16"], [0.0, 4.0])
    assert got == [("multi_worker", "none", 0.0), ("multi_worker", "none", 4.0),
                   ("multi_worker", "fp16", 0.0), ("multi_worker", "fp16", 4.0),
                   ("horovod", "none", None), ("horovod", "fp16", None)]
    assert overlap.config_name("multi_worker", "fp16", 4.0) == "multi_worker+fp16 @4MB"
    assert overlap.config_name("horovod", "none", None) == "horovod"
    assert compression.wire_bytes(18_926_000, "fp16") == 9_463_000
    assert compression.wire_bytes(18_926_000, "none") == 18_926_000


def test_summary_is_against_the_longer_of_compute_and_all_reduce():
    row = overlap.summarize([0.020, 0.018, 0.022], [0.150, 0.160, 0.155], [0.170, 0.160, 0.180],
                            [0.221, 0.200, 0.240])
    assert row["floor_s"] == pytest.approx(0.155) and row["serial_s"] == pytest.approx(0.175)
    assert row["step_over_floor"] == pytest.approx(0.170 / 0.155)
    # Paired by repeat: base / bucketed throughput ratio, then the median.
    assert row["vs_no_buckets_per_repeat"] == pytest.approx([0.221 / 0.170, 1.25, 0.240 / 0.180])
    assert row["vs_no_buckets"] == pytest.approx(1.3)
    assert "vs_no_buckets" not in overlap.summarize([1.0], [2.0], [2.5], None)


def _args(**kw):
    parser = argparse.ArgumentParser()
    overlap.add_arguments(parser)
    return parser.parse_args([f"--{k.replace('_', '-')}={v}" for k, v in kw.items()])


@pytest.mark.parametrize("kw, message", [
    ({"engines": "nccl"}, "--engines takes"), ({"buckets": "a"}, "--buckets takes"),
    ({"buckets": "-1"}, "--buckets needs values >= 0"), ({"workers": 1}, "-n >= 2"),
    ({"rate": "1gbit"}, "needs --hosts"), ({"grad_compression": "int8"}, "--grad-compression takes")])
def test_bad_flags_are_refused_before_anything_runs(kw, message):
    with pytest.raises(SystemExit, match=message):
        overlap.run(_args(**kw))


def _result():
    rows = [{"name": n, "wire_bytes": 18.9e6, "compute_s": 0.02, "allreduce_s": 0.15,
             "floor_s": 0.15, "serial_s": 0.17, "step_s": s, "step_over_floor": s / 0.15,
             **({"vs_no_buckets": v} if v else {})}
            for n, s, v in (("multi_worker @0MB", 0.22, None), ("multi_worker @4MB", 0.2, 1.1))]
    return {"workers": 2, "hosts": 2, "rate": "1gbit", "repeats": 3, "left_out": ["shm: x"],
            "results": {"wide_mlp": {"rows": rows}}}


def test_table_and_plot_show_every_configuration():
    from matplotlib.figure import Figure

    text = overlap.table(_result())
    assert "multi_worker @4MB" in text and "1.100" in text and "left out: shm" in text
    fig = Figure()
    overlap.plot(_result(), fig)
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels == ["multi_worker @0MB", "multi_worker @4MB"]
