"""`bench memory-cap` (#40, #51): its commands, table and plot (no process started)."""

from __future__ import annotations

import argparse

from tfdist.bench import memory_cap


def _args(**kw):
    return argparse.Namespace(**{"stages": 4, "limit_mib": 1900.0, "steps": 6,
                                 "save_every_steps": 2, "model": "model_parallel_mlp",
                                 "shard": None, "control_shard": "optimizer", **kw})


def test_processes_are_stages_or_shm_workers_at_the_shard_level():
    assert memory_cap._layout(_args(), None)[:2] == ["--strategy", "pipeline"]
    layout = memory_cap._layout(_args(), "parameters")
    assert layout[:4] == ["--strategy", "shm", "--shard", "parameters"]
    assert layout[-2:] == ["--final-weights", "sharded"]  # no process writes the whole model


def _job(peak, exit_code=0):
    return {"exit": exit_code, "s": 60.0, "killed": None, "resumed": False,
            "tasks": [{"rss_peak_mib": peak, "oom_kills": int(exit_code == 137)}] * 4}


def test_the_table_and_plot_show_the_control_that_the_cap_kills():
    from matplotlib.figure import Figure

    result = {"limit_mib": 1900.0, "stages": 4, "shard": "parameters",
              "one": {"exit": 137, "rss_peak_mib": 1900.0, "oom_kills": 1},
              "control": {"shard": "optimizer", **_job(1900.0, 137)},
              "whole": _job(1400.0), "interrupted": _job(1400.0, -9),
              "resumed": {**_job(1400.0), "resumed": True},
              "final_weights_worst_allowance": 0.1}
    text = memory_cap.table(result)
    assert "4 shm workers at --shard parameters" in text
    assert "control (--shard optimizer): exit 137" in text and "oom kills 4" in text
    assert "resumed" in text.splitlines()[-2]
    fig = Figure()
    memory_cap.plot(result, fig)
    assert len(fig.axes[0].patches) == 1 + 4 * 4  # one, then each job's 4 workers
