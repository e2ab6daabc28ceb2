"""`bench scaling`'s no-communication control: its arithmetic, JSON, table and plot.

No process starts here: the runs are replaced by fakes with chosen step times,
so every figure below is arithmetic, not a measurement.
"""

import argparse
import os

import pytest

from tfdist.bench import runs, scaling, timing


def _times(start, step, n):
    return [start + step * i for i in range(n)]


def test_overlap_counts_only_the_steps_all_workers_ran_side_by_side():
    # Worker 1 starts 1 s late with 0.5 s steps: the window is [2.0, 5.0] (worker 0's end).
    early, late = _times(0.0, 0.5, 11), _times(1.0, 0.5, 11)
    steps, overlap = scaling.overlap_step_s([early, late], warmup=2)
    assert steps == pytest.approx([0.5, 0.5]) and overlap == pytest.approx(3.0)
    # A worker twice as slow inside the window keeps its own pace.
    steps, _ = scaling.overlap_step_s([_times(0.0, 0.5, 11), _times(0.0, 1.0, 6)], warmup=1)
    assert steps == pytest.approx([0.5, 1.0])
    with pytest.raises(ValueError, match="process 0 ended 0 step.*Pass more --steps"):
        scaling.overlap_step_s([_times(0.0, 0.1, 5), _times(10.0, 0.1, 5)], warmup=1)


def test_control_throughput_is_the_sum_of_the_workers_alone():
    results = [{"global_batch_size": 64, "step_end_times": _times(0.0, 0.1, 10)},
               {"global_batch_size": 64, "step_end_times": _times(0.0, 0.2, 10)}]
    point = scaling.control_point(results, warmup=1)
    # Over [0.2, 0.9] (worker 1's warm-up end to worker 0's last step): 640 + 320 examples/s.
    assert point["examples_per_s"] == pytest.approx(960.0)
    assert point["worker_step_s"] == pytest.approx([0.1, 0.2])
    assert point["global_batch_size"] == 128 and point["workers"] == 2
    assert point["step_s"] == pytest.approx(128 / 960.0)  # the synchronous step of that rate
    assert point["overlap_s"] == pytest.approx(0.7)


def test_efficiency_is_contention_times_communication():
    base, control, many = 100.0, 180.0, 153.0  # examples/s of 1 worker, control, 2 workers
    _, (_, efficiency) = scaling.speedups([base, many], [1, 2])
    _, (_, contention) = scaling.speedups([base, control], [1, 2])
    (_, vs) = scaling.against_control([base, many], [base, control])
    assert contention == pytest.approx(0.9) and vs == pytest.approx(0.85)
    assert efficiency == pytest.approx(contention * vs)
    with pytest.raises(ValueError, match="one control per point. Received: 2 points, 1"):
        scaling.against_control([1.0, 2.0], [1.0])


def _fake_result(gbs, step, steps=10, start=0.0):
    return {"global_batch_size": gbs, "step_s": step, "examples_per_s": gbs / step,
            "step_end_times": _times(start, step, steps), "num_workers": 1,
            "strategy": "single"}


def _args(tmp_path, **kw):
    parser = argparse.ArgumentParser()
    scaling.add_arguments(parser)
    args = parser.parse_args(["--recipes", "wide_mlp", "--modes", "weak", "--strategies", "shm",
                              "--per-worker-batch", "8", "--steps", "10", "--warmup", "2",
                              "--cpu-bind", "cores", *kw.pop("flags", [])])
    args.out = str(tmp_path)
    return args


def test_control_runs_k_single_workers_together_pinned_as_the_k_worker_run(tmp_path, monkeypatch):
    got = {}

    def run_together(cmds, timeout_s, env, what):
        got.update(cmds=cmds, env=env)
        assert len(os.listdir(env["TFDIST_BENCH_START_DIR"])) == 0
        return [[_fake_result(8, 0.1)], [_fake_result(8, 0.125)]]

    monkeypatch.setattr(runs, "run_together", run_together)
    point = scaling.one_control(_args(tmp_path), "wide_mlp", 2, 16, "wide_mlp_control_weak_2_r0")
    for i, cmd in enumerate(got["cmds"]):
        assert cmd[cmd.index("-n") + 1] == "1"
        assert cmd[cmd.index("--share") + 1] == f"{i}/2"  # worker i's cores of a 2-worker run
        train = cmd[cmd.index("tfdist.bench.train_worker") + 1:]
        assert train[train.index("--strategy") + 1] == "single"
        assert train[train.index("--global-batch-size") + 1] == "8"  # the per-worker batch
        assert train[train.index("--threads") + 1] == "1"
        assert train[train.index("--model-dir") + 1].endswith(f"wide_mlp_control_weak_2_r0_w{i}")
        # Room to go on past --steps 10 until both ran 10 (timing.until_all_done ends them).
        assert train[train.index("--steps-per-epoch") + 1] == str(10 * scaling.CONTROL_STEP_CAP)
    assert got["env"]["TFDIST_BENCH_START_PARTIES"] == "2"
    assert got["env"]["TFDIST_BENCH_DONE_STEPS"] == "10"
    assert got["env"]["TFDIST_BENCH_DONE_DIR"] != got["env"]["TFDIST_BENCH_START_DIR"]
    assert not (tmp_path / "runs").exists()  # the workers' model dirs went with the run
    assert got["env"]["TF_NUM_INTEROP_THREADS"] == "1"
    assert got["env"]["TFDIST_BENCH_WARMUP_STEPS"] == "2"
    assert point["examples_per_s"] == pytest.approx(80.0 + 64.0)
    assert len(point["runs"]) == 2 and "load_avg_1m" in point


def test_control_is_unbound_when_the_workers_are(tmp_path, monkeypatch):
    got = {}
    monkeypatch.setattr(runs, "run_together", lambda cmds, *a, **k: got.update(cmds=cmds) or [
        [_fake_result(8, 0.1)], [_fake_result(8, 0.1)]])
    scaling.one_control(_args(tmp_path, flags=["--cpu-bind", "none"]), "wide_mlp", 2, 16, "c")
    assert not any("tfdist.bench.bind" in cmd for cmd in got["cmds"])


def _fake_bench(monkeypatch, control_tput):
    """one_run and one_control replaced: 1 worker 100 examples/s, 2 workers 153, control
    `control_tput` per repeat (in order)."""
    tputs = iter(control_tput)

    def one_run(args, recipe, strategy, workers, gbs, label, compression="none"):
        step = gbs / (100.0 if workers == 1 else 153.0)
        return {**_fake_result(gbs, step), "workers": workers, "load_avg_1m": 0.5}

    def one_control(args, recipe, workers, gbs, label):
        t = next(tputs)
        return {"workers": workers, "global_batch_size": gbs, "examples_per_s": t,
                "step_s": gbs / t, "worker_step_s": [2 * gbs / t] * workers,
                "worker_batch_size": [gbs // workers] * workers, "overlap_s": 1.0,
                "load_avg_1m": 0.7, "runs": []}

    monkeypatch.setattr(scaling, "one_run", one_run)
    monkeypatch.setattr(scaling, "one_control", one_control)


def test_json_carries_the_control_and_both_efficiencies(tmp_path, monkeypatch):
    _fake_bench(monkeypatch, [170.0, 180.0, 190.0])
    result = scaling.run(_args(tmp_path, flags=["--repeats", "3"]))
    assert result["control"] is True
    control = result["controls"]["wide_mlp"]["weak"]
    assert control["workers"] == [1, 2] and control["examples_per_s"] == [100.0, 180.0]
    assert control["efficiency"] == pytest.approx([1.0, 0.9])  # contention alone
    assert control["efficiency_per_repeat"][1] == pytest.approx([0.85, 0.9, 0.95])
    assert control["efficiency_range"][1] == pytest.approx([0.85, 0.95])
    assert control["global_batch_size"] == [8, 16] and control["noise"] == [False, False]
    curve = result["results"]["wide_mlp"]["shm"]["weak"]
    assert curve["efficiency"] == pytest.approx([1.0, 0.765])
    assert curve["efficiency_vs_control"] == pytest.approx([1.0, 153 / 180])
    assert curve["efficiency_vs_control_per_repeat"][1] == pytest.approx(
        [153 / 170, 153 / 180, 153 / 190])
    assert curve["control_efficiency"] == control["efficiency"]
    assert curve["efficiency"][1] == pytest.approx(
        curve["control_efficiency"][1] * curve["efficiency_vs_control"][1])
    assert result["weak"]["efficiency_vs_control"] == curve["efficiency_vs_control"]
    assert result["weak"]["control_efficiency"] == control["efficiency"]
    assert "contention alone" in result["note"]


def test_table_has_a_control_row_per_worker_count_and_a_vs_control_column(tmp_path,
                                                                           monkeypatch):
    _fake_bench(monkeypatch, [180.0])
    out = scaling.table(scaling.run(_args(tmp_path)))
    lines = out.splitlines()
    assert "wide_mlp, weak scaling (load 1m 0.5-0.7):" in lines  # the recipe and mode's block
    head = next(line for line in lines if line.lstrip().startswith("engine"))
    assert "vs ctrl" in head and "contention alone" in out
    control_rows = [line.split() for line in lines
                    if line.lstrip().startswith(scaling.CONTROL + "  ")]
    assert len(control_rows) == 2  # K = 1 (the baseline) and K = 2
    # control (no comm), workers, global batch, step ms, ex/s, speedup, the efficiency
    assert control_rows[1][3:9] == ["2", "16", "88.9", "180", "1.80", "0.90"]
    shm_two = next(line for line in lines if line.lstrip().startswith("shm  2 "))
    assert shm_two.split()[-1] == f"{153 / 180:.2f}"


def test_no_control_leaves_the_report_as_before(tmp_path, monkeypatch):
    _fake_bench(monkeypatch, [])
    result = scaling.run(_args(tmp_path, flags=["--no-control"]))
    assert result["control"] is False and result["controls"] == {}
    assert "efficiency_vs_control" not in result["results"]["wide_mlp"]["shm"]["weak"]
    assert "vs ctrl" not in scaling.table(result)


def test_plot_draws_a_row_against_one_worker_and_a_row_against_the_control(tmp_path,
                                                                            monkeypatch):
    from matplotlib.figure import Figure

    _fake_bench(monkeypatch, [170.0, 190.0])
    result = scaling.run(_args(tmp_path, flags=["--repeats", "2"]))
    fig = Figure()
    scaling.plot(result, fig)
    top, bottom = fig.axes
    labels = [t.get_text() for t in top.get_legend().get_texts()]
    assert labels == ["wide_mlp (shm)", "wide_mlp control: contention alone"]
    assert "against the no-comm control" in bottom.get_title()
    assert [t.get_text() for t in bottom.get_legend().get_texts()] == ["wide_mlp (shm)"]
    assert list(bottom.lines[0].get_ydata()) == pytest.approx(
        result["results"]["wide_mlp"]["shm"]["weak"]["efficiency_vs_control"])


def test_start_barrier_holds_each_process_after_its_warmup_until_every_party_is_there(tmp_path):
    directory = str(tmp_path / "start")
    barrier = timing.start_barrier(directory, parties=2, after_steps=2, timeout_s=5)
    barrier.on_train_begin()
    barrier.on_train_batch_end(0)
    assert not os.path.exists(directory)  # still warming up: not there yet
    open_other = os.path.join(directory, "1")  # another process (pid 1) got there first
    os.makedirs(directory)
    open(open_other, "w").close()
    barrier.on_train_batch_end(1)
    assert sorted(os.listdir(directory)) == sorted(["1", str(os.getpid())])
    barrier.on_train_batch_end(2)  # once only
    with pytest.raises(RuntimeError, match="2 of 3 processes reached the start barrier"):
        timing.start_barrier(directory, parties=3, timeout_s=0.05).on_train_begin()


def test_until_all_done_keeps_a_process_stepping_until_every_one_ran_its_steps(tmp_path):
    directory = str(tmp_path / "done")
    os.makedirs(directory)
    done = timing.until_all_done(directory, parties=2, steps=2)
    done.on_train_batch_end(0)
    assert os.listdir(directory) == []
    done.on_train_batch_end(1)  # through its own steps: marked, but the other is not
    assert os.listdir(directory) == [str(os.getpid())]
    done.on_train_batch_end(2)  # so it goes on stepping
    open(os.path.join(directory, "1"), "w").close()  # the other process got through
    with pytest.raises(timing.AllDone):
        done.on_train_batch_end(3)
