"""`python -m tfdist.bench pipeline` runs briefly and writes well-formed JSON and PNG.

Not a timing test: it checks the report's shape and the arithmetic it
carries, never how fast anything ran.
"""

import json
import os

import pytest

from tests.conftest import run_py, tail

pytestmark = pytest.mark.integration


def test_pipeline_bench_writes_json_and_png(tmp_path):
    out = str(tmp_path)
    proc = run_py(["-m", "tfdist.bench", "pipeline", "--out", out, "--width", "32",
                   "--layers", "2", "--batch", "16", "--steps", "2", "--warmup", "1",
                   "--microbatches", "1,4"], timeout=180)
    assert proc.returncode == 0, tail(proc)
    result = json.load(open(os.path.join(out, "pipeline.json")))
    assert result["benchmark"] == "pipeline" and result["machine"]["host_cpus"] >= 1
    points = result["points"]
    assert [p["microbatches"] for p in points] == [1, 4]
    for p in points:
        assert p["stages"] == 2 and p["step_s"] > 0 and len(p["stage_busy_s"]) == 2
        assert p["bubble_theory"] == pytest.approx(1 / (p["microbatches"] + 1))
        assert p["bubble_measured"] == pytest.approx(
            1 - sum(p["stage_busy_s"]) / 2 / p["step_s"])
    assert points[0]["speedup_vs_naive"] == 1.0
    with open(os.path.join(out, "pipeline.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert "bubble (p-1)/(m+p-1)" in proc.stdout


def test_bench_module_top_level_imports_no_tensorflow():
    proc = run_py(["-c", "import sys, tfdist.bench.pipeline, tfdist.model_parallel.plan, "
                         "tfdist.model_parallel.pipeline, tfdist.model_parallel.tensor_parallel;"
                         "print('tensorflow' in sys.modules)"], timeout=60)
    assert proc.returncode == 0, tail(proc)
    assert proc.stdout.strip() == "False"
