"""Pure arithmetic and command shapes of the issue-8 benchmarks (no processes, no timing)."""

import pytest

from tests.conftest import run_py, tail
from tfdist.bench import allreduce, collectives, comm, overhead, runs, scaling, stats, timing


def test_speedup_and_efficiency_are_relative_to_one_worker():
    speedup, efficiency = scaling.speedups([100.0, 150.0, 120.0], [1, 2, 3])
    assert speedup == [1.0, 1.5, 1.2]
    assert efficiency == pytest.approx([1.0, 0.75, 0.4])
    with pytest.raises(ValueError, match="1 worker"):
        scaling.speedups([1.0], [2])


def test_sizes_and_bus_bandwidth():
    assert allreduce.parse_sizes("4KB, 1MB,0.5GB") == pytest.approx([0.004, 1.0, 500.0])
    with pytest.raises(ValueError, match="unit"):
        allreduce.parse_sizes("64")
    assert allreduce.bus_bandwidth(1.0, 2) == 1.0 and allreduce.bus_bandwidth(1.0, 4) == 1.5


def test_comm_prediction_follows_the_ring_formula():
    p = comm.predict(flops_per_example=1e6, batch_per_worker=100, grad_bytes=1e9, workers=4,
                     gflops=10.0, busbw_gbs=2.0)
    assert p["compute_s"] == pytest.approx(0.01)
    assert p["comm_s"] == pytest.approx(2 * 3 / 4 * 0.5)
    assert p["step_s"] == pytest.approx(p["compute_s"] + p["comm_s"])
    assert comm.predict(1e6, 100, 1e9, 1, 10.0, 2.0)["comm_s"] == 0.0


def test_collectives_expectations_and_check_catch_a_wrong_result():
    assert collectives.expected("all_reduce", 0, 2).tolist() == [10, 12, 14, 16]
    assert collectives.expected("reduce_scatter", 1, 2).tolist() == [14, 16]
    assert collectives.expected("reduce", 1, 2) is None
    good = [{"rank": r, "after": {op: (None if collectives.expected(op, r, 2) is None else
                                       collectives.expected(op, r, 2).tolist())
                                  for op in collectives.OPS}} for r in range(2)]
    assert all(collectives.check(good, 2).values())
    good[1]["after"]["broadcast"] = [9.0, 9.0, 9.0, 9.0]
    assert collectives.check(good, 2)["broadcast"] is False


def test_steady_step_time_skips_warmup():
    assert timing.steady_step_s([0.0, 5.0, 6.0, 7.0, 8.0], warmup=1) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="warmup"):
        timing.steady_step_s([0.0, 1.0], warmup=1)


def test_result_lines_survive_launcher_prefixes():
    out = "noise\n[worker 0] TFDIST_BENCH_RESULT {\"a\": 1}trailing\nTFDIST_BENCH_RESULT {\"b\": 2}"
    assert runs.parse(out) == [{"a": 1}, {"b": 2}]


def test_horovod_command_shapes():
    cmd = runs.horovod_command("/v", 2, "mpi", "m", ["x"], "-mca foo 1")
    assert cmd[:5] == ["/v/bin/horovodrun", "-np", "2", "-H", "localhost:2"]
    assert "--mpi" in cmd and any(c.startswith("--mpi-args=--allow-run-as-root") for c in cmd)
    assert cmd[-4:] == ["/v/bin/python", "-m", "m", "x"]
    with pytest.raises(ValueError):
        runs.horovod_command("/v", 2, "nccl", "m", [])


@pytest.mark.integration
def test_bench_modules_import_no_tensorflow():
    proc = run_py(["-c", "import sys, tfdist.bench.__main__, tfdist.bench.scaling, "
                         "tfdist.bench.allreduce, tfdist.bench.overhead, tfdist.bench.comm, "
                         "tfdist.bench.collectives, tfdist.bench.runs, tfdist.bench.timing, "
                         "tfdist.bench.raw_keras, tfdist.bench.train_worker, tfdist.bench.paired_worker; "
                         "print('tensorflow' in sys.modules)"], timeout=60)
    assert proc.returncode == 0, tail(proc)
    assert proc.stdout.strip() == "False"


@pytest.mark.integration
def test_train_worker_help_is_usage_not_a_traceback():
    proc = run_py(["-m", "tfdist.bench.train_worker", "--help"], timeout=60)
    assert proc.returncode == 0, tail(proc)
    assert proc.stdout.startswith("`python -m tfdist.bench.train_worker RECIPE")
    assert "--global-batch-size" in proc.stdout and "Traceback" not in proc.stderr


def test_median_run_picks_the_median_try_and_keeps_all():
    from tfdist.bench import scaling

    tries = [{"step_s": 0.05, "id": "a"}, {"step_s": 0.03, "id": "b"}, {"step_s": 0.04, "id": "c"}]
    got = scaling.median_run(tries)
    assert got["id"] == "c" and got["tries_step_s"] == [0.05, 0.03, 0.04]
    assert scaling.median_run(tries[:2])["id"] == "b"  # even count: the lower median


def test_hosts_flags_link_rate_and_configs():
    from tfdist.bench import on_hosts

    assert on_hosts.link_gbs("1gbit") == pytest.approx(0.125)
    assert on_hosts.link_gbs("10gbit") == pytest.approx(1.25)
    assert on_hosts.check_args(0, None) is None
    assert on_hosts.check_args(2, "500mbit") == pytest.approx(0.0625)
    for hosts, rate, match in ((2, None, "shaped link.*Received: --rate 'none'"),
                               (2, "fast", "1gbit, 10gbit.*Received: 'fast'"),
                               (1, "1gbit", "at least 2. Received: --hosts 1"),
                               (0, "1gbit", "--rate 1gbit needs --hosts")):
        with pytest.raises(SystemExit, match=match):
            on_hosts.check_args(hosts, rate)
    cfgs = on_hosts.tf_configs(["198.18.0.1", "198.18.0.2"], port=7)
    assert cfgs[1] == {"cluster": {"worker": ["198.18.0.1:7", "198.18.0.2:7"]},
                       "task": {"type": "worker", "index": 1}}


def test_hosts_prediction_is_measured_compute_plus_ring_at_link_rate():
    # 1 worker: 0.1 s; 2 workers at 1 Gbit/s with 125 MB of gradients: + 2(1)/2 x 1 s.
    assert comm.comm_seconds(125e6, 2, 0.125) == pytest.approx(1.0)
    assert comm.comm_seconds(125e6, 1, 0.125) == 0.0
    weak = scaling.predicted_steps(0.1, [64, 64], [1, 2], 125e6, 0.125)
    assert weak == pytest.approx([0.1, 1.1])
    strong = scaling.predicted_steps(0.1, [128, 64], [1, 2], 125e6, 0.125)
    assert strong == pytest.approx([0.1, 1.05])


def test_t_interval_matches_the_textbook_and_refuses_one_value():
    assert stats.t975(1) == 12.706 and stats.t975(30) == 2.042 and stats.t975(45) == 2.021
    assert stats.t975(10_000) == 1.960
    mean, lo, hi = stats.mean_ci95([1.0, 2.0, 3.0])  # sd 1, n 3: half-width 4.303 / sqrt(3)
    assert mean == 2.0 and hi - mean == pytest.approx(4.303 / 3 ** 0.5) == mean - lo
    with pytest.raises(ValueError, match="at least 2 values"):
        stats.mean_ci95([1.0])
    assert [stats.verdict(*ci, 0.98) for ci in ((0.981, 0.99), (0.9, 0.97), (0.97, 0.99))] == [
        "met", "not met", "undecided"]


def test_overhead_ratio_is_the_mean_of_paired_round_ratios():
    s = overhead.summarize([99.0, 101.0, 100.0], [100.0, 100.0, 100.0])
    assert s["ratios"] == pytest.approx([0.99, 1.01, 1.0]) and s["ratio"] == pytest.approx(1.0)
    assert s["ci_width"] == pytest.approx(2 * 4.303 * 0.01 / 3 ** 0.5)
    assert s["verdict"] == "undecided" and s["ratio_of_medians"] == pytest.approx(1.0)


def test_overhead_engines_are_checked_before_anything_runs():
    args = type("A", (), {"workers": 1, "engines": "shm", "venv": None})
    with pytest.raises(SystemExit, match="-n 1 measures the engine single only"):
        overhead.engines_for(args)
    args.workers, args.engines = 2, "shm,mpi"
    with pytest.raises(SystemExit, match="Received: 'shm,mpi'"):
        overhead.engines_for(args)
    args.engines = "shm,multi_worker"
    assert overhead.engines_for(args) == ["shm", "multi_worker"]


def test_scaling_pairs_each_repeat_with_its_own_baseline_and_flags_above_one():
    assert scaling.paired_efficiencies([100.0, 80.0], [180.0, 170.0], 2) == pytest.approx(
        [0.9, 170 / 160])
    assert scaling.noise_flags([1.0, 0.93, 1.06]) == [False, False, True]
    assert scaling.engine_name("shm", "none") == "shm"
    assert scaling.engine_name("multi_worker", "fp16") == "multi_worker+fp16"


def test_scaling_refuses_bad_compression_and_one_worker_before_running():
    args = type("A", (), {"hosts": 0, "rate": None, "modes": "weak", "strategies": "shm",
                          "grad_compression": "none,fp8", "workers": 2})
    with pytest.raises(SystemExit, match="--grad-compression.*Received: 'none,fp8'"):
        scaling.run(args)
    args.grad_compression, args.workers = "fp16", 1
    with pytest.raises(SystemExit, match="-n >= 2. Received: -n 1"):
        scaling.run(args)
    args.workers, args.hosts, args.rate, args.cpu_bind = 2, 2, "1gbit", "cores"
    with pytest.raises(SystemExit, match="--cpu-bind applies to workers on this host.*"
                                         "Received: --cpu-bind cores --hosts 2"):
        scaling.run(args)


def test_horovod_venv_is_found_where_the_cluster_module_says(tmp_path, monkeypatch):
    # One place reads TFDIST_HOROVOD_VENV (tfdist.cluster.horovod); the benches ask it.
    venv = tmp_path / "hvd"
    monkeypatch.setenv("TFDIST_HOROVOD_VENV", str(venv))
    assert runs.horovod_venv() is None  # no bin/horovodrun there yet
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "horovodrun").write_text("#!/bin/sh\n")
    (venv / "bin" / "horovodrun").chmod(0o755)
    assert runs.horovod_venv() == str(venv)
    assert runs.horovod_venv(str(tmp_path / "elsewhere")) is None  # an explicit --venv wins


def test_overhead_progress_line_gives_each_engine_its_ratio_so_far():
    per = {"horovod": {"examples_per_s": {"tfdist": [98.0, 99.0, 100.0],
                                          "raw": [100.0, 100.0, 100.0]}},
           "shm": {"examples_per_s": {"tfdist": [50.0], "raw": [40.0]}}}
    line = overhead.progress(3, per, ["horovod", "shm"], 0.02)
    assert line.startswith("overhead: after round 3: horovod 0.990 [")
    assert "(3 rounds, width " in line and "shm 1.250 (1 round)" in line
    resolved = {"e": {"examples_per_s": {"tfdist": [99.0, 99.0], "raw": [100.0, 100.0]}}}
    assert "(2 rounds, resolved)" in overhead.progress(2, resolved, ["e"], 0.02)


def test_bench_hosts_are_per_run_and_only_dead_runs_clusters_are_swept():
    from tfdist.bench import on_hosts
    from tfdist.hosts.plan import check_name

    assert check_name(on_hosts.cluster_name(4194304)) == "tfdist-bench-4194304"  # largest pid
    names = ["tfdist-bench-10", "tfdist-bench-11", "tfdist", "t123-abc", "tfdist-bench-x",
             "tfdist-bench"]
    assert on_hosts.stale_clusters(names, alive=lambda pid: pid == 11) == ["tfdist-bench-10"]


def test_paired_segments_are_timed_from_their_turn_to_their_last_step():
    from tfdist.bench import paired_worker

    # k=2: steps end at 1,2 | turn back at 5: 6,7 | turn back at 10: 11,13 (a slow step).
    stamps, starts = [1.0, 2.0, 6.0, 7.0, 11.0, 13.0], [5.0, 10.0]
    assert paired_worker.segment_times(stamps, starts, 2) == [1.0, 1.5]
    assert paired_worker.segment_times(stamps, starts, 2, warmup=2) == [1.5]
    assert paired_worker.segment_times(stamps, [5.0, 10.0, 14.0], 2) == [1.0, 1.5]  # no 4th
    assert [overhead.warmup_segments(w, 4) for w in (0, 1, 4, 5, 8)] == [1, 1, 1, 2, 2]


def test_paired_turns_alternate_between_threads_and_a_failure_ends_the_wait():
    import threading

    from tfdist.bench import paired_worker

    turns, seen = paired_worker.Turns(), []

    def other():
        for i in range(3):
            turns.wait_for("raw")
            seen.append(f"raw{i}")
            turns.hand_to("tfdist")

    thread = threading.Thread(target=other)
    thread.start()
    for i in range(3):
        seen.append(f"tfdist{i}")
        turns.hand_to("raw")
        turns.wait_for("tfdist")
    thread.join(5)
    assert seen == ["tfdist0", "raw0", "tfdist1", "raw1", "tfdist2", "raw2"]
    turns.hand_to("raw")
    turns.fail(ValueError("boom"))
    with pytest.raises(RuntimeError, match="other side of the paired benchmark failed: "
                                           "ValueError: boom"):
        turns.wait_for("tfdist")
    with pytest.raises(RuntimeError, match="kept the turn for more than 0.01 s"):
        paired_worker.Turns().wait_for("raw", timeout_s=0.01)


def test_overhead_options_are_checked_before_anything_runs():
    args = type("A", (), {"compare": "segments", "segment_steps": 1, "segments": 8,
                          "rounds": 2, "max_rounds": 2})
    with pytest.raises(SystemExit, match="--segment-steps >= 2 .* Received: --segment-steps 1"):
        overhead._check(args, [])
    args.compare = "runs"
    overhead._check(args, ["no_csv_log"])  # segment sizes do not apply to separate runs
    with pytest.raises(SystemExit, match="unknown variants \\['fast'\\]"):
        overhead._check(args, ["fast"])
    # The A/A control pairs raw with raw: separate runs have no pair.
    with pytest.raises(SystemExit, match="raw_vs_raw .* needs --compare segments. "
                                         "Received: --compare runs"):
        overhead._check(args, ["raw_vs_raw"])


def test_scaling_error_bars_are_none_for_one_repeat_and_never_negative():
    # One repeat: no spread, so no bars (the point and its 1-sample range differ by a rounding).
    assert scaling.error_bars([1.0, 0.7799999999999999], [[1.0], [0.78]]) is None
    # A median point outside its repeats' range: the side it crosses is 0, not negative.
    below, above = scaling.error_bars([1.0, 0.9, 0.5], [[1.0, 1.0], [0.8, 0.95], [0.6, 0.7]])
    assert below == pytest.approx([0.0, 0.1, 0.0]) and above == pytest.approx([0.0, 0.05, 0.2])


def test_scaling_plots_a_one_repeat_result():
    """`bench scaling --repeats 1` crashed here: "yerr must not contain negative values"."""
    from matplotlib.figure import Figure

    tput, counts = [100.0, 234.0], [1, 3]  # 234 / 100 / 3 rounds below 234 / (3 x 100)
    speedup, efficiency = scaling.speedups(tput, counts)
    per_repeat = [[1.0], scaling.paired_efficiencies([100.0], [234.0], 3)]
    assert efficiency[1] < per_repeat[1][0]
    curve = {"workers": counts, "speedup": speedup, "efficiency": efficiency,
             "efficiency_per_repeat": per_repeat,
             "efficiency_range": [[min(p), max(p)] for p in per_repeat],
             "noise": scaling.noise_flags(efficiency)}
    result = {"weak": curve, "results": {"digits_mlp": {"shm": {"weak": curve}}}, "repeats": 1}
    fig = Figure()
    scaling.plot(result, fig)
    (ax,) = fig.axes
    assert [tuple(line.get_ydata()) for line in ax.lines][0] == tuple(efficiency)
    assert not ax.collections  # no error bars drawn for a single repeat


def test_benchmark_children_get_the_checkout_before_the_users_pythonpath():
    import os

    users = os.pathsep.join(["/opt/modules/site-packages", runs.REPO, "/home/me/lib"])
    env = runs.child_env({"EXTRA": "1"}, environ={"PYTHONPATH": users, "HOME": "/home/me"})
    assert env["PYTHONPATH"].split(os.pathsep) == [
        runs.REPO, "/opt/modules/site-packages", "/home/me/lib"]  # kept, after the checkout
    assert env["HOME"] == "/home/me" and env["EXTRA"] == "1"
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "2" and env["PYTHONUNBUFFERED"] == "1"
    assert runs.child_env(environ={})["PYTHONPATH"] == runs.REPO
    assert runs.child_env(environ={"PYTHONPATH": ""})["PYTHONPATH"] == runs.REPO


def test_every_benchmark_runner_sets_pythonpath_through_child_env():
    import pathlib

    bench = pathlib.Path(runs.REPO, "tfdist", "bench")
    setting = sorted(p.name for p in bench.glob("*.py") if '"PYTHONPATH"' in p.read_text())
    assert setting == ["runs.py"], f"set PYTHONPATH with runs.child_env, not in {setting}"
