"""`python -m tfdist.bench async` runs end to end, briefly, and writes JSON + PNG."""

import json
import os

import pytest

from tests.conftest import run_py, tail

from tfdist.bench import async_ps

pytestmark = pytest.mark.integration


def test_command_shapes():
    class Args:
        workers, timeout, recipe, epochs, steps_per_epoch, threads = 2, 60.0, "digits_mlp", 1, 3, 1
        straggler_worker = 1

    sync = async_ps.command("sync", Args, 50, "/m")
    assert sync[sync.index("-n") + 1] == "2" and "multi_worker" in sync
    asyn = async_ps.command("async", Args, 50, "/m")
    assert asyn[asyn.index("--ps") + 1:asyn.index("--ps") + 4] == ["1", "--workers", "2"]
    assert "parameter_server" in asyn and asyn[asyn.index("--straggler-delay-ms") + 1] == "50"


def test_bench_async_brief_run_writes_json_and_png(tmp_path):
    out = str(tmp_path / "bench")
    proc = run_py(["-m", "tfdist.bench", "async", "--out", out, "--epochs", "1",
                   "--steps-per-epoch", "6", "--delays-ms", "30", "--timeout", "120"], timeout=400)
    assert proc.returncode == 0, tail(proc)
    with open(os.path.join(out, "async.json"), encoding="utf-8") as f:
        result = json.load(f)
    assert result["benchmark"] == "async" and result["delays_ms"] == [30]
    assert [(r["mode"], r["delay_ms"]) for r in result["runs"]] == [("sync", 30), ("async", 30)]
    for r in result["runs"]:
        assert r["examples_per_s"] > 0 and len(r["loss_per_epoch"]) == 1
        assert 0 < r["final_train_loss"] < 10 and r["test_loss"] > 0
    assert sum(result["runs"][1]["steps_per_worker"]) == 6
    assert result["async_over_sync_throughput"]["30"] > 0
    with open(os.path.join(out, "async.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert "async/sync throughput: 30 ms:" in proc.stdout
