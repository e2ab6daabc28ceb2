"""Each issue-8 benchmark runs briefly on real processes and writes well-formed JSON + PNG.

Not timing tests: tiny sizes, and only the report's shape and its internal
arithmetic are asserted, never how fast anything ran.
"""

import json
import math
import os

import pytest

from tests.conftest import run_py, tail

pytestmark = pytest.mark.integration
PNG = b"\x89PNG\r\n\x1a\n"


def _bench(tmp_path, name, *flags, timeout=240):
    out = str(tmp_path / "bench")
    proc = run_py(["-m", "tfdist.bench", name, "--out", out, *flags], timeout=timeout)
    assert proc.returncode == 0, tail(proc)
    with open(os.path.join(out, f"{name}.png"), "rb") as f:
        assert f.read(8) == PNG
    with open(os.path.join(out, f"{name}.json"), encoding="utf-8") as f:
        result = json.load(f)
    assert result["benchmark"] == name and result["machine"]["host_cpus"] >= 1
    return result, proc.stdout, proc.stderr


def test_scaling_shares_one_repeated_baseline_and_flags_noise(tmp_path):
    # digits_mlp's steps take about 1 ms: 10 of them once ended one control worker before the
    # other had run 2 (#38); each now steps on until both ran their 10.
    result, stdout, stderr = _bench(
        tmp_path, "scaling", "--recipes", "digits_mlp", "--steps", "10", "--warmup", "2",
        "--per-worker-batch", "8", "--modes", "weak", "--strategies", "shm",
        "--grad-compression", "none,fp16", "--repeats", "2",
        "--train-flags=--preempt-check-steps 100", "--cpu-bind", "cores", "--control",
        timeout=900)
    # What a run leaves (model.keras, backups) went with it, and each run said so as it ended.
    assert sorted(os.listdir(tmp_path / "bench")) == ["scaling.json", "scaling.png"]
    progress = [line for line in stderr.splitlines() if line.startswith("[")]
    assert [line.split()[0] for line in progress] == [f"[{i}/8]" for i in range(1, 9)], stderr
    assert "control, 2 workers alone:" in progress[1] and "examples/s" in progress[1]
    table = [line for line in stdout.splitlines() if not line.startswith("wrote ")]  # paths
    assert max(len(line) for line in table) <= 100, stdout
    assert result["train_flags"] == "--preempt-check-steps 100" and result["inter_op_threads"] == 1
    assert result["cpu_bind"] == "cores"
    base = result["baselines"]["digits_mlp"]["weak"]
    assert base["global_batch_size"] == 8 and len(base["tries_examples_per_s"]) == 2
    curves = result["results"]["digits_mlp"]
    assert set(curves) == {"shm", "shm+fp16"} and "strong" not in result
    for name, comp in (("shm", "none"), ("shm+fp16", "fp16")):
        c = curves[name]["weak"]
        assert c["grad_compression"] == comp and c["workers"] == [1, 2]
        # One baseline for every engine: the same run is each curve's first point.
        assert c["runs"][0] == base["run"] and c["speedup"][0] == 1.0
        assert c["global_batch_size"] == [8, 16]
        assert [r["num_workers"] for r in c["runs"]] == [1, 2]
        assert c["runs"][1]["tries_step_s"] and len(c["runs"][1]["tries_step_s"]) == 2
        assert all(math.isfinite(t) and t > 0 for t in c["examples_per_s"])
        assert c["efficiency"][1] == pytest.approx(c["speedup"][1] / 2)
        per_repeat = c["efficiency_per_repeat"][1]
        assert len(per_repeat) == 2 and c["efficiency_range"][1] == [min(per_repeat),
                                                                     max(per_repeat)]
        assert c["noise"] == [e > 1 for e in c["efficiency"]]
    assert "noise" in result["note"] and "range" in stdout
    # The no-communication control: 2 `single` workers alone, together, each repeat.
    control = result["controls"]["digits_mlp"]["weak"]
    assert result["control"] is True and control["workers"] == [1, 2]
    assert control["runs"][0]["step_s"] == base["step_s"]  # one worker is its own control
    two = control["runs"][1]
    assert two["worker_batch_size"] == [8, 8] and control["global_batch_size"] == [8, 16]
    assert [r["strategy"] for r in two["runs"]] == ["single", "single"]
    assert [r["num_workers"] for r in two["runs"]] == [1, 1]
    assert all(math.isfinite(s) and s > 0 for s in two["worker_step_s"]) and two["overlap_s"] > 0
    assert len(control["tries_examples_per_s"][1]) == 2
    assert all(math.isfinite(t) and t > 0 for t in control["examples_per_s"])
    assert control["efficiency"][1] == pytest.approx(two["examples_per_s"] / (2 * base[
        "examples_per_s"]))
    for name in ("shm", "shm+fp16"):
        c = curves[name]["weak"]
        assert c["efficiency_vs_control"][1] > 0
        assert c["efficiency"][1] == pytest.approx(
            control["efficiency"][1] * c["efficiency_vs_control"][1])
    assert "vs ctrl" in stdout and "control (no comm)" in stdout


def test_allreduce_engines_and_fp16_compression_in_one_run(tmp_path):
    # One run (one start-up of each engine's ranks less than two runs): shm and MWMS, and
    # each with fp16 compression, whose bytes on the wire are measured.
    result, stdout, _ = _bench(tmp_path, "allreduce", "--sizes", "4KB,4MB,16MB", "--iters",
                               "2", "--variants", "0,2,9,10", "--small-tensors", "30",
                               timeout=480)
    assert [r["engine"] for r in result["results"]] == ["shm", "mwms", "mwms", "shm"]
    for r in result["results"]:
        assert [p["size_mb"] for p in r["points"]] == [0.004, 4.0, 16.0]
        for p in r["points"]:
            assert p["busbw_gbs"] == pytest.approx(p["size_mb"] * 1e6 / p["seconds"] / 1e9)
    by_label = {r["label"]: r["points"][2]["busbw_gbs"] for r in result["results"]}
    assert result["fastest_16_64mb"] == max(by_label, key=by_label.get)
    assert result["goal_met"] == (result["fastest_min_busbw_16_64mb_gbs"] >= 1.2)
    assert "goal >= 1.2 GB/s" in stdout
    small = result["small_tensors"]
    assert small["count"] == 30 and all(4.096 <= kb <= 65.536 for kb in small["tensor_kb"])
    for key in ("fused", "unfused", "one_tensor"):
        assert small["busbw_gbs"][key] == pytest.approx(
            small["total_mb"] * 1e6 / small["seconds"][key] / 1e9)
    assert small["fused_over_one"] == pytest.approx(
        small["busbw_gbs"]["fused"] / small["busbw_gbs"]["one_tensor"])
    assert "30 tensors of 4-64 KB" in stdout
    # shm writes its 1/n of the reduced tensor and (n-1)/n for its peers: the size, per rank.
    shm_16mb = result["results"][0]["points"][2]
    assert shm_16mb["wire_mb_per_rank"] == pytest.approx(16.0, rel=1e-3)
    # fp16 at 4 MB. MWMS: bytes its gRPC ring wrote to sockets, measured, not the tensor
    # size assumed.
    mwms, mwms_fp16, shm_fp16 = (result["results"][i]["points"][1]["wire_mb_per_rank"]
                                 for i in (1, 2, 3))
    assert mwms > 3.0 and 0.4 < mwms_fp16 / mwms < 0.6, (mwms, mwms_fp16)
    assert shm_fp16 == pytest.approx(2.0, rel=1e-3)
    assert "fp16 compression: " in stdout


def test_overhead_reports_the_ratio_with_its_interval_and_every_round(tmp_path):
    # digits_mlp: the report's arithmetic does not depend on the model, and each of the 4
    # runs trains, evaluates and saves it in about 3 s, wide_mlp in about 13.
    result, stdout, _ = _bench(tmp_path, "overhead", "--workers", "1", "--recipe", "digits_mlp",
                               "--global-batch-size", "8", "--steps", "5", "--warmup", "1",
                               "--rounds", "2", "--max-rounds", "2", "--compare", "runs",
                               timeout=900)
    assert result["engines"] == ["single"] and result["cpu_bind"] == "none"  # the default
    assert result["compare"] == "runs" and result["results"]["single"]["segment_step_s"] == []
    r = result["results"]["single"]
    xs = r["examples_per_s"]
    assert r["rounds"] == 2 and len(xs["tfdist"]) == len(xs["raw"]) == 2
    assert all(math.isfinite(v) and v > 0 for v in xs["tfdist"] + xs["raw"])
    assert r["ratios"] == pytest.approx([t / w for t, w in zip(xs["tfdist"], xs["raw"])])
    lo, hi = r["ci95"]
    assert lo < r["ratio"] < hi and r["ratio"] == pytest.approx(sum(r["ratios"]) / 2)
    assert r["ci_width"] == pytest.approx(hi - lo)
    assert r["verdict"] in ("met", "not met", "undecided") and len(r["load_avg_1m"]) == 2
    assert (result["ratio"], result["ci95"]) == (r["ratio"], r["ci95"])
    assert "single: tfdist/raw = " in stdout and "95% CI [" in stdout


def test_overhead_segments_take_turns_in_the_same_two_workers(tmp_path):
    # Two MWMS workers each run tfdist's fit and the raw fit on two threads, handing the
    # turn over every 3 steps: their collectives must never interleave. digits_mlp, not
    # wide_mlp: the turns and the report's arithmetic do not depend on the model, and each
    # of the 6 paired runs trains, evaluates and saves wide_mlp's 4.7M parameters in about
    # 13 s, digits_mlp's in about 3 s.
    result, stdout, _ = _bench(tmp_path, "overhead", "--workers", "2", "--engines", "multi_worker",
                               "--recipe", "digits_mlp", "--global-batch-size", "16",
                               "--segment-steps", "3", "--segments", "4", "--warmup", "4",
                               "--rounds", "2", "--max-rounds", "2",
                               "--variants", "no_csv_log,raw_vs_raw", "--keep-runs",
                               timeout=900)
    assert result["compare"] == "segments" and result["segment_steps"] == 3
    r = result["results"]["multi_worker"]
    assert r["rounds"] == 2 and len(r["segment_step_s"]) == 2
    for round_, tfdist, raw in zip(r["segment_step_s"], r["examples_per_s"]["tfdist"],
                                   r["examples_per_s"]["raw"]):
        # Two warm-up segments (4 steps at 3 per segment), then 4 counted of each side.
        assert len(round_["tfdist_step_s"]) == len(round_["raw_step_s"]) == 4
        assert tfdist == pytest.approx(16 * 4 / sum(round_["tfdist_step_s"]))
        assert raw == pytest.approx(16 * 4 / sum(round_["raw_step_s"]))
    assert r["ratios"] == pytest.approx([t / w for t, w in zip(r["examples_per_s"]["tfdist"],
                                                               r["examples_per_s"]["raw"])])
    # The variant is a paired run of its own, its ratio against its own raw side.
    assert len(r["examples_per_s"]["no_csv_log"]) == 2 and 0 < r["variant_ratios"]["no_csv_log"]
    assert "multi_worker: tfdist/raw = " in stdout and "alternating segments" in result["note"]
    assert "; no_csv_log " in stdout
    # The A/A control: raw on both threads, its ratio the benchmark's own bias.
    control = r["variant_ratios"]["raw_vs_raw"]
    assert control == pytest.approx(sum(r["variant_ratios_per_round"]["raw_vs_raw"]) / 2)
    assert len(r["examples_per_s"]["raw_vs_raw"]) == 2 and 0.5 < control < 2.0
    assert "; raw_vs_raw " in stdout
    runs_dir = tmp_path / "bench" / "runs"  # kept model dirs of the trainer: none for the control
    assert (runs_dir / "multi_worker_no_csv_log_1").is_dir()
    assert not any(p.name.startswith("multi_worker_raw_vs_raw") for p in runs_dir.iterdir())


def test_collectives_two_workers_match_numpy(tmp_path):
    result, stdout, _ = _bench(tmp_path, "collectives", "--workers", "2")
    assert result["all_passed"] is True and set(result["passed"]) == {
        "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter"}
    w0, w1 = result["workers_results"]
    assert w0["after"]["all_reduce"] == w1["after"]["all_reduce"] == [10.0, 12.0, 14.0, 16.0]
    assert w1["after"]["broadcast"] == w0["before"]
    assert "before" in stdout and "vs numpy" in stdout


def test_comm(tmp_path):
    result, stdout, _ = _bench(tmp_path, "comm", "--steps", "4", "--warmup", "1",
                               "--per-worker-batch", "8", "--bandwidth-gbs", "0.5",
                               "--gflops", "50")
    assert result["model"]["params"] == 4_731_914
    p = result["predicted"]
    assert p["step_s"] == pytest.approx(p["compute_s"] + p["comm_s"])
    assert p["comm_s"] == pytest.approx(result["model"]["grad_bytes"] / 0.5e9)
    assert result["measured_step_s"] > 0
    assert "predicted ms" in stdout


def test_allreduce_across_hosts_is_bounded_by_the_shaped_link(tmp_path):
    from tfdist.hosts import unavailable

    reason = unavailable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs namespaced hosts: {reason}")
        pytest.skip(reason)
    # 100 Mbit/s: 4 MB takes >= 0.3 s on the link, long beside the token bucket's burst.
    result, stdout, _ = _bench(tmp_path, "allreduce", "--hosts", "2", "--rate", "100mbit",
                               "--sizes", "4MB", "--iters", "2", "--variants", "0,2")
    assert (result["hosts"], result["rate"], result["ranks"]) == (2, "100mbit", 2)
    assert result["link_gbs"] == pytest.approx(0.0125)
    assert [r["engine"] for r in result["results"]] == ["mwms"]  # shm is one host's memory
    (point,) = result["results"][0]["points"]
    assert point["busbw_over_link"] == pytest.approx(point["busbw_gbs"] / 0.0125)
    # The link is the limit (the shaping works) and the ring gets a fair part of it.
    assert 0.2 < point["busbw_over_link"] < 1.1, point
    assert "of the link rate" in stdout
    from tfdist.hosts.rig import STATE_ROOT
    left = [n for n in (os.listdir(STATE_ROOT) if os.path.isdir(STATE_ROOT) else [])
            if n.startswith("tfdist-bench-")]
    assert left == [], left  # the run's own cluster is gone
