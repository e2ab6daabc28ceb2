"""Progress during an epoch into a pipe (#48): under `tfdist.launch -n 2`, read as a CI
log is, the chief prints a `tfdist.progress` line every TFDIST_PROGRESS_S seconds of
an epoch (here 1 s; 30 by default), the other worker none.

Each line is timed as it arrives through the pipe. Two epochs of 100 steps, each
step at least 20 ms (the benchmarks' straggler option on worker 0): a few seconds of
training; by hand, a 90-second epoch of the same job printed a line every 30 s
(docs/options.md).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, clean_env

pytestmark = pytest.mark.integration

LINE = re.compile(r"\[worker (\d)\] tfdist: epoch (\d)/2 step (\d+)/100 \((\d+)%\): "
                  r"(\d+) examples/s, (\d+) s in, ETA (?:\d+ s|\d+:\d\d), loss \d+\.\d{4}$")


def test_under_the_launcher_the_chief_prints_a_progress_line_every_interval(tmp_path):
    command = [sys.executable, "-m", "tfdist.launch", "-n", "2", "--", sys.executable, "-m",
               "tfdist.train", "digits_mlp", "--strategy", "multi_worker", "--epochs", "2",
               "--steps-per-epoch", "100", "--straggler-delay-ms", "20", "--threads", "1",
               "--model-dir", str(tmp_path / "run")]
    proc = subprocess.Popen(command, cwd=REPO, env=clean_env(TFDIST_PROGRESS_S="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timed = []
    try:
        deadline = time.monotonic() + 300
        for text in proc.stdout:
            timed.append((time.monotonic(), text.rstrip("\n")))
            assert time.monotonic() < deadline, "\n".join(t for _, t in timed[-40:])
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "\n".join(t for _, t in timed)
    assert proc.returncode == 0, out[-3000:]
    progress = [(t, LINE.match(text)) for t, text in timed if "] tfdist: epoch " in text]
    assert progress and all(m for _, m in progress), out[-3000:]
    assert {m.group(1) for _, m in progress} == {"0"}  # only the chief
    for epoch in "12":
        begun = next(t for t, text in timed if text == f"[worker 0] Epoch {epoch}/2")
        ended = next(t for t, text in timed
                     if re.match(r"\[worker 0\] 100/100 - ", text) and t > begun)
        lines = [(t, m) for t, m in progress if m.group(2) == epoch]
        assert len(lines) >= 2, out[-3000:]
        steps = [int(m.group(3)) for _, m in lines]
        assert steps == sorted(steps) and steps[-1] <= 100
        # At the first step after each second: never sooner than the interval, never
        # much later (a step takes tens of ms; slack for a loaded machine).
        times = [begun] + [t for t, _ in lines] + [ended]
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert all(g >= 0.9 for g in gaps[1:-1]), gaps
        assert max(gaps) <= 5.0, gaps
        assert [int(m.group(6)) for _, m in lines] == sorted(int(m.group(6)) for _, m in lines)
