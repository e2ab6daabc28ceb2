"""Pure arithmetic and parsing of `bench pipeline-processes` and `bench.memory` (no processes)."""

import json
import os
import time

import pytest

from tfdist.bench import memory, pipeline_processes as pp

STATUS = """Name:\tpython
VmPeak:\t 3060 kB
VmHWM:\t    1612 kB
VmRSS:\t    1500 kB
Threads:\t1
"""


def test_status_lines_are_read_in_bytes():
    vm = memory.parse_status(STATUS)
    assert vm["VmHWM"] == 1612 * 1024 and vm["VmRSS"] == 1500 * 1024
    assert "Threads" not in vm and "Name" not in vm
    with pytest.raises(ValueError, match="kB"):
        memory.parse_status("VmRSS:\t12 MB\n")


def test_this_process_status_parses_and_its_peak_is_at_least_its_rss():
    with open(f"/proc/{os.getpid()}/status") as f:
        vm = memory.parse_status(f.read())
    assert vm["VmHWM"] >= vm["VmRSS"] > 0


def test_task_index_comes_from_tf_config_in_the_environ_block():
    config = json.dumps({"cluster": {"worker": ["a:1", "b:2"]},
                         "task": {"type": "worker", "index": 1}})
    environ = b"\0".join([b"PATH=/bin", b"TF_CONFIG=" + config.encode(), b"X=1"]) + b"\0"
    assert memory.task_index(environ) == 1
    assert memory.task_index(b"PATH=/bin\0") is None
    # A horovodrun --gloo rank: its HOROVOD_RANK; TF_CONFIG wins where both are set.
    assert memory.task_index(b"HOROVOD_RANK=3\0HOROVOD_SIZE=4\0") == 3
    assert memory.task_index(b"HOROVOD_RANK=3\0" + environ) == 1


@pytest.mark.integration
def test_the_sampler_finds_tasks_below_a_middleman_nearest_first():
    import subprocess
    import sys
    import time

    # root -> sh -> python (HOROVOD_RANK=0) -> python (HOROVOD_RANK=0): horovodrun's shape,
    # and a rank's own child holding the same variable.
    code = ("import os, subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
            "time.sleep(30)")
    root = subprocess.Popen(["sh", "-c", f"HOROVOD_RANK=0 {sys.executable} -c \"{code}\"; true"])
    try:
        sampler = memory.Sampler(root.pid, 2, 0.05)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(memory._descendants(root.pid)) < 2:
            time.sleep(0.05)
        sampler._find()
        rank = next(p for p in memory._descendants(root.pid)
                    if b"HOROVOD_RANK=0" in open(f"/proc/{p}/environ", "rb").read())
        assert sampler.pids == {0: rank}  # the rank itself, not its child
    finally:
        for pid in memory._descendants(root.pid):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        root.kill()
        root.wait()


def test_peaks_until_a_time_keep_only_the_samples_before_it():
    samples = [(1.0, 100, 100), (2.0, 300, 300), (3.0, 200, 300), (4.0, 900, 900)]
    assert memory.peaks(samples, until=3.0) == {"hwm_bytes": 300, "rss_max_bytes": 300,
                                                "samples": 3}
    assert memory.peaks(samples)["hwm_bytes"] == 900
    assert memory.peaks([], until=1.0) == {"hwm_bytes": 0, "rss_max_bytes": 0, "samples": 0}


def test_cpu_and_run_queue_wait_are_read_from_stat_and_schedstat():
    stat = "4242 (tf (worker) 1) S 1 4242 1 0 -1 4194560 10 0 0 0 250 50 0 0 20 0 9 0"
    assert memory.parse_stat_cpu_s(stat, 100) == pytest.approx(3.0)  # (250 + 50) ticks
    assert memory.parse_schedstat_wait_s("123000000 45000000 17\n") == pytest.approx(0.045)
    with open(f"/proc/{os.getpid()}/stat") as f:
        assert memory.parse_stat_cpu_s(f.read(), os.sysconf("SC_CLK_TCK")) >= 0


def test_counters_between_two_times_are_interpolated_between_samples():
    # (time, rss, hwm, cpu s, wait s)
    samples = [(0.0, 1, 1, 0.0, 0.0), (1.0, 1, 1, 0.5, 0.1), (2.0, 1, 1, 1.5, 0.1)]
    assert memory.between(samples, 0.5, 1.5) == pytest.approx(0.75)  # 0.25 -> 1.0
    assert memory.between(samples, 0.5, 2.0, field=4) == pytest.approx(0.05)
    assert memory.between(samples, 0.5, 2.5) is None  # not covered: no guess
    assert memory.between(samples[:1], 0.0, 0.0) is None


def test_sampler_clock_is_the_step_timer_clock():
    # Step ends are time.perf_counter() in another process; samples time.monotonic().
    assert time.get_clock_info("perf_counter").implementation == \
        time.get_clock_info("monotonic").implementation


def test_gpipe_ideal_ratio():
    from tfdist.model_parallel.plan import ideal_step_ratio

    assert ideal_step_ratio(2, 8) == pytest.approx(9 / 16)
    assert ideal_step_ratio(4, 4) == pytest.approx(7 / 16)
    assert ideal_step_ratio(1, 8) == 1.0
    assert ideal_step_ratio(2, 1) == 1.0  # naive model parallel: no overlap
    with pytest.raises(ValueError, match="stages=0"):
        ideal_step_ratio(0, 8)


def test_median_step_skips_the_warmup_and_an_outlier():
    times = [0.0, 5.0, 5.1, 5.2, 9.0, 9.1]  # step 1 traces; one step slowed by another job
    assert pp.median_step_s(times, warmup=1) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="warmup \\+ 2"):
        pp.median_step_s([0.0, 1.0], warmup=1)


def test_stage_totals_read_the_chief_placement_table():
    out = "\n".join([
        "[worker 0] layer      device           params            bytes",
        "[worker 0] hidden_0   task:0/CPU:0     266240          1064960",
        "[worker 0] total      task:0/CPU:0  100954112  403816448 (55%)",
        "[worker 0] total      task:1/CPU:0   83947530  335790120 (45%)",
        "[worker 1] tfdist: pipeline stage 1 serving"])
    assert pp.stage_totals(out) == {0: {"params": 100954112, "bytes": 403816448},
                                    1: {"params": 83947530, "bytes": 335790120}}
    assert pp.stage_totals("total 3") == {}


@pytest.mark.integration
def test_bench_samples_each_stage_process_and_writes_json_and_png(tmp_path):
    """One 2-stage job of a tiny model: both tasks found and sampled, the chief's table read."""
    from tests.conftest import run_py, tail

    out = str(tmp_path)
    proc = run_py(["-m", "tfdist.bench", "pipeline-processes", "--out", out, "--parts", "memory",
                   "--memory-stages", "2", "--memory-microbatches", "2", "--memory-model",
                   "model_parallel_mlp --hidden-units 16 --hidden-layers 2 --threads 1",
                   "--memory-steps", "3", "--timeout", "120"], timeout=180)
    assert proc.returncode == 0, tail(proc)
    result = json.load(open(os.path.join(out, "pipeline-processes.json")))
    (run,) = result["memory"]["runs"]
    assert (run["stages"], run["microbatches"]) == (2, 2)
    assert [p["task"] for p in run["processes"]] == [0, 1]
    for p in run["processes"]:
        # A TensorFlow process: well over 100 MB resident; the whole run's peak is the larger.
        assert p["run_peak_bytes"] >= p["train_peak_bytes"] > 100 * memory.MB
        assert p["samples"] > 1
    assert sorted(run["stage_totals"]) == ["0", "1"]
    with open(os.path.join(out, "pipeline-processes.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_time_part_runs_each_batch_size_and_reports_it_against_the_ideal(monkeypatch):
    """`_run` replaced by a recorder: the argv of each run, the arithmetic and the report."""
    import argparse

    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    calls = []

    def fake_run(argv, tasks, timeout_s, interval_s, **kw):
        calls.append((argv, tasks, kw))
        batch = int(argv[argv.index("--global-batch-size") + 1])
        step = batch / 1000 * (0.6 if tasks == 2 else 1.0)  # 2 stages: 0.6 of one process
        proc = {"cpu_s_per_step": step, "cpu_share": 0.8, "wait_s_per_step": 0.01}
        return {"median_step_s": step, "load_avg_1m": 0.5, "processes": [proc] * tasks}

    monkeypatch.setattr(pp, "_run", fake_run)
    parser = argparse.ArgumentParser()
    pp.add_arguments(parser)
    args = parser.parse_args(["--parts", "time", "--time-batch-sizes", "64,512",
                              "--repeats", "2", "--time-model", "model_parallel_mlp"])
    result = pp.run(args)
    t = result["time"]
    assert [p["global_batch_size"] for p in t["points"]] == [64, 512]
    assert [p["microbatch_rows"] for p in t["points"]] == [8, 64]
    for p in t["points"]:
        assert p["ratio"] == pytest.approx(0.6)
        assert p["vs_ideal"] == pytest.approx(0.6 / (9 / 16))
    assert len(calls) == 2 * 2 * 2  # batch sizes x repeats x (2 stages, 1 process)
    argv, tasks, kw = calls[0]
    assert tasks == 2 and kw["bind"] == "cores" and argv[argv.index("--devices") + 1] == "0"
    argv, tasks, kw = calls[1]
    assert tasks == 1 and kw["share"] == "0/2" and argv[argv.index("--devices") + 1] == "2"
    assert all("--global-batch-size" in a and "gpipe" in a for a, _, _ in calls)
    text = pp.table(result)
    assert "batch" in text and "median" in text and "1.067" in text  # 0.6 / 0.5625
    pp.plot(result, Figure())
