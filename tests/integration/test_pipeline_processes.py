"""Real processes: `--strategy pipeline` with one stage per task (`tfdist.launch -n P`).

model_parallel_mlp (3 hidden Dense layers + logits, 4 layers with weights)
trained for 2 epochs (44 steps) with Adam: 2 stage processes (GPipe, 2 micro-batches),
interleaved (V = 2) on 2 and 4 stage processes, zero bubble on 4, and each on 2
copies x 2 stages end with the weights of one process (rtol 1e-5), and for one epoch so do 2 stage processes with tensor parallel 2 inside
each and 2 data-parallel copies of those (4 processes, data x pipeline x tensor); under
mixed_float16 (one epoch) 2 stage processes at M = 1 end with one process's weights
to the bit. At #43's size (4 x 256, lr 1e-3, 40 steps) 2 stage processes under
1F1B at M = 4 are the one-process GPipe pipeline to the bit, and at M = 8 end
with one process's weights. The chief holds stage 0 and drives the run; the
placement table, read from the variables, shows every other stage's weights
on its own task. The saved model is the plain, unsplit Keras model.

A stage killed with SIGKILL, and one stopped with SIGSTOP (a hung host: its
port stays open), each end the job naming the stage and its address; the
same command again resumes from the last backup and ends with the
uninterrupted run's weights. Under tfdist.launch, a SIGKILLed stage ends the
launcher with exit 4 (lost peer), as the chief does.

Schedules past 1F1B (#42): interleaved 1F1B (V = 2: 4 chunks, 2 on each of 2
stage processes; 8 chunks on 4; and on 2 copies x 2 stages), zero bubble on 4
stage processes and on 2 copies x 2 stages each end with one process's weights
(rtol 1e-5), and so does `--schedule auto --balance time` on 2, whose chief
prints the planner's table and runs its pick.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import (REPO, WORKERS, clean_env, override, run_py, run_py_many, tail,
                            wait_for_checkpoint)
from tests.weights import dump_weights
from tfdist import exit_codes
from tfdist.launch import free_ports, worker_tf_configs

pytestmark = pytest.mark.integration

DUMP = os.path.join(WORKERS, "train_dump.py")
ARGS = ["model_parallel_mlp", "--seed", "0", "--deterministic",
        "--hidden-units", "64", "--optimizer", "adam", "--learning-rate", "0.003",
        "--verbose", "0", "--threads", "1", "--save-every-steps", "5", "--epochs", "2"]
PIPELINE = ["--strategy", "pipeline", "--devices", "0"]  # the recipe's 2: one process's
FP16 = ["--precision", "mixed_float16", "--epochs", "1"]
# On CPUs with float16 arithmetic (AVX512-FP16, AMX), oneDNN's graph rewrites fuse a
# Dense layer's float16 ops differently in a one-process step and in a stage's, and
# the runs part by float16 rounding; without them the same ops run in the same order.
NO_ONEDNN = {"TF_ENABLE_ONEDNN_OPTS": "0"}
DEEP = ["--hidden-layers", "7"]
WIDE = ["--hidden-layers", "4", "--hidden-units", "256", "--learning-rate", "0.001",
        "--steps-per-epoch", "20"]
RUNS = {"single": (1, ["--strategy", "single"]),
        "two": (2, [*PIPELINE, "--microbatches", "2"]),
        # Data x pipeline x tensor: 2 copies of 2 stages, each stage's feed-forward
        # pairs split over its task's 2 CPU devices; and 2 stages x tensor parallel 2.
        # One epoch: the row-parallel sums add the shards' partials in another order,
        # which Adam amplifies to 1.3 allowances of rtol 1e-5 by the second epoch and
        # 0.15 after the first (2 stage processes without tensor parallelism: 0.4).
        "single_e1": (1, ["--strategy", "single", "--epochs", "1"]),
        "hybrid": (4, [*PIPELINE, "--stages", "2", "--microbatches", "2",
                       "--tensor-parallel", "2", "--epochs", "1"]),
        # ... and it ends as a model larger than one process does: model.json and
        # Keras's sharded weights, written one weight at a time.
        "two_tp": (2, [*PIPELINE, "--microbatches", "2", "--tensor-parallel", "2",
                       "--epochs", "1", "--final-weights", "sharded"]),
        # #42: chunks cycling over the tasks, and the backward split into I and W.
        "interleaved": (2, [*PIPELINE, "--microbatches", "4", "--schedule", "interleaved",
                            "--virtual-stages", "2"]),
        # With 2 copies, at zb_hybrid's M = 2: the two end 4e-7 apart (not to the bit, as
        # they do without copies, in one process: not explained), each within rtol 1e-5 of
        # one process; at M = 4 one weight near zero ends 1.5e-6 away (atol 1e-6).
        "interleaved_hybrid": (4, [*PIPELINE, "--stages", "2", "--microbatches", "2",
                                   "--schedule", "interleaved", "--virtual-stages", "2"]),
        # Interleaved on 4 stage processes: 8 chunks, so 7 hidden layers + logits.
        "deep_single": (1, ["--strategy", "single", *DEEP]),
        "interleaved_four": (4, [*PIPELINE, "--microbatches", "4", "--schedule", "interleaved",
                                 "--virtual-stages", "2", *DEEP]),
        "zb_four": (4, [*PIPELINE, "--microbatches", "4", "--schedule", "zb"]),
        "zb_hybrid": (4, [*PIPELINE, "--stages", "2", "--microbatches", "2", "--schedule", "zb"]),
        # The planner on the chief, which holds the model without values: it times fresh
        # copies of the layers, picks a schedule and cuts by the measured time.
        "auto": (2, [*PIPELINE, "--microbatches", "4", "--schedule", "auto", "--balance",
                     "time"]),
        # mixed_float16, one epoch: one process, and 2 stage processes with M = 1 (the
        # same batch through the same float16 ops, so the same weights to the bit).
        "single_fp16": (1, ["--strategy", "single", *FP16]),
        "two_fp16": (2, [*PIPELINE, "--microbatches", "1", *FP16]),
        # #43's size: 4 x 256, Adam lr 1e-3, 40 steps. At M = 4 a ReLU pre-activation
        # crosses zero by rounding at step 15 and one process's weights are left
        # (tests/model_parallel/test_pipeline_adam_floor.py shows the pipeline's
        # gradient is still one process's there); stage processes must then be the
        # one-process pipeline's run to the bit, and at M = 8 one process's run.
        "wide_single": (1, ["--strategy", "single", *WIDE]),
        "wide_one4": (1, ["--strategy", "pipeline", "--devices", "2", "--microbatches", "4",
                          *WIDE]),
        "wide_two4": (2, [*PIPELINE, "--microbatches", "4", "--schedule", "1f1b", *WIDE]),
        "wide_two8": (2, [*PIPELINE, "--microbatches", "8", *WIDE])}


def _weights(dump):
    return dump_weights(np.load(os.path.join(dump, "worker0.npz")))


def _rows(out):
    """(layer, device) rows of the chief's placement table ("[worker 0] hidden_0  task:0/CPU:0 ...")."""
    rows = [line.split()[2:4] for line in out.splitlines() if line.startswith("[worker 0] ")]
    return [(row[0], row[1]) for row in rows if len(row) == 2
            and row[0].startswith(("hidden_", "logits"))]


def _table(out):
    """layer -> device, from the chief's placement table (one device per layer)."""
    return dict(_rows(out))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stages")
    commands = {}
    for name, (n, extra) in RUNS.items():
        dump, model_dir = str(tmp / name / "dump"), str(tmp / name / "model")
        command = [DUMP, dump, *override(ARGS, *extra), "--model-dir", model_dir]
        if n > 1:
            command = ["-m", "tfdist.launch", "-n", str(n), "--timeout", "240", "--",
                       sys.executable, *command]
        env = clean_env(**NO_ONEDNN) if "fp16" in name else None
        commands[name] = (command, env, dump, model_dir)
    # Two at a time, launches included (--threads 1, deterministic: the weights do not
    # depend on what else runs; a stage process mostly waits on its peers' sends, so one
    # launch alone left the cores idle: the fixture took 189 s in CI one launch at a time).
    # The launches with most processes first, so that the last two to end are short.
    order = sorted(RUNS, key=lambda name: -RUNS[name][0])
    procs = dict(zip(order, run_py_many([commands[name][0] for name in order],
                                        envs=[commands[name][1] for name in order])))
    out = {}
    for name, (_, _, dump, model_dir) in commands.items():
        assert procs[name].returncode == 0, tail(procs[name])
        out[name] = (_weights(dump), model_dir, procs[name])
    return out


@pytest.mark.parametrize("name", ["two", "hybrid", "two_tp", "interleaved",
                                  "interleaved_hybrid", "interleaved_four", "zb_four",
                                  "zb_hybrid", "auto"])
def test_stage_processes_end_with_one_process_weights(runs, name):
    reference = {"hybrid": "single_e1", "two_tp": "single_e1", "interleaved_four": "deep_single"}
    single = runs[reference.get(name, "single")][0]
    assert len(single) == len(runs[name][0])
    for a, b in zip(runs[name][0], single):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_schedule_auto_prints_the_planners_table_and_runs_its_pick(runs):
    out = runs["auto"][2].stdout
    assert "[worker 0] tfdist: the planner's predictions (4 micro-batches of 16 rows" in out
    assert "each stage process; cuts by time" in out
    rows = [line.split()[2] for line in out.splitlines()
            if line.startswith("[worker 0] ") and line.split()[2:3] and line.split()[-1]
            in ("yes", "no")]
    assert sorted(rows) == ["1f1b", "gpipe", "interleaved", "zb"]
    (picked,) = [line for line in out.splitlines() if "--schedule auto picked" in line]
    name = picked.split("picked ")[1].split(":")[0]  # "zb" or "interleaved v=2", ...
    assert f"schedule={name} theoretical bubble" in out  # the pipeline runs the pick


def test_stage_processes_at_43s_size_run_the_one_process_pipeline_to_the_bit(runs):
    """4 x 256 under Adam for 40 steps: 2 stage processes under 1F1B at M = 4 are the
    one-process GPipe pipeline at M = 4 to the bit (the same sums in the same order),
    and at M = 8 they end with one process's weights."""
    single, one4 = runs["wide_single"][0], runs["wide_one4"][0]
    assert len(single) == 10
    for a, b in zip(runs["wide_two4"][0], one4):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(runs["wide_two8"][0], single):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_stage_processes_under_mixed_float16_end_with_one_process_weights_to_the_bit(runs):
    # The loss scale's unscale and finite check run on each stage's task
    # (placed_updates): the same ops in the same order as Keras's, and with M = 1
    # each stage sees the one-process batch, so nothing may differ in any bit
    # (oneDNN's rewrites off: NO_ONEDNN).
    assert "precision=mixed_float16" in runs["two_fp16"][2].stdout
    for a, b in zip(runs["two_fp16"][0], runs["single_fp16"][0]):
        np.testing.assert_array_equal(a, b)
    moved = max(float(np.abs(a - b).max()) for a, b in zip(runs["two_fp16"][0],
                                                           runs["single"][0]))
    assert moved > 0  # float16 trained, not float32


def test_each_stage_lives_on_its_own_task_and_the_servers_end_quietly_with_the_chief(runs):
    out = runs["two"][2].stdout
    assert _table(out) == {"hidden_0": "task:0/CPU:0", "hidden_1": "task:0/CPU:0",
                           "hidden_2": "task:1/CPU:0", "logits": "task:1/CPU:0"}, out[-3000:]
    assert "pipeline p=2 m=2 schedule=gpipe" in out
    assert "[worker 1] tfdist: pipeline stage 1 serving at 127.0.0.1:" in out
    # The chief told its stages it finished (#48): they end quietly, in every layout.
    for name in ("two", "zb_four", "hybrid", "interleaved"):
        assert "has gone" not in runs[name][2].stdout, runs[name][2].stdout[-3000:]
    four = runs["zb_four"][2].stdout  # 4 stage processes (1F1B on processes: wide_two4)
    assert sorted(set(_table(four).values())) == [f"task:{i}/CPU:0" for i in range(4)]
    hybrid = runs["hybrid"][2].stdout
    # Tensor parallel inside the stage tasks: each task's CPU split in 2, a shard on each.
    assert {device for _, device in _rows(hybrid)} == {
        "task:0/CPU:0", "task:0/CPU:1", "task:1/CPU:0", "task:1/CPU:1"}, hybrid[-3000:]
    assert ("hidden_0", "task:0/CPU:1") in _rows(hybrid)  # a shard on the task's second CPU
    assert ("data-parallel copy 1 of the stages: task:2/CPU:0, task:2/CPU:1, task:3/CPU:0, "
            "task:3/CPU:1") in hybrid
    assert "pipeline p=2 x 2 data-parallel copies m=2" in hybrid
    # The run's first line and each task say copy and stage (#38): task 2 is copy 1's
    # stage 0, and the 2 copies are the data-parallel replicas.
    assert "strategy=pipeline num_replicas=2 stages=2 copies=2 workers=4" in hybrid
    assert "[worker 2] tfdist: pipeline copy 1 stage 0 serving at" in hybrid
    assert "num_replicas=1 stages=4 copies=1" in four
    # #42: 4 chunks over 2 tasks (chunk k on task k mod 2); bubble (P-1)/(V·M+P-1).
    interleaved = runs["interleaved"][2].stdout
    assert "pipeline p=2 m=4 schedule=interleaved v=2 theoretical bubble 0.111" in interleaved
    assert _table(interleaved) == {"hidden_0": "task:0/CPU:0", "hidden_1": "task:1/CPU:0",
                                   "hidden_2": "task:0/CPU:0", "logits": "task:1/CPU:0"}
    assert "pipeline p=4 m=4 schedule=zb theoretical bubble 0.200" in runs["zb_four"][2].stdout
    # 8 chunks over 4 tasks (chunk k on task k mod 4), and interleaving within 2 copies.
    four = runs["interleaved_four"][2].stdout
    assert "pipeline p=4 m=4 schedule=interleaved v=2 theoretical bubble 0.273" in four
    assert _table(four) == {**{f"hidden_{k}": f"task:{k % 4}/CPU:0" for k in range(7)},
                            "logits": "task:3/CPU:0"}, four[-3000:]
    copies = runs["interleaved_hybrid"][2].stdout
    assert "pipeline p=2 x 2 data-parallel copies m=2 schedule=interleaved v=2" in copies
    assert "data-parallel copy 1 of the stages: task:2/CPU:0, task:3/CPU:0" in copies


def test_each_stage_task_writes_its_own_variables_into_the_backup(runs):
    """#40: the chief's backup file is the index (the record alone); each stage task's
    variables are in that task's part, written there (`tfdist.backup_parts`)."""
    for name, tasks in (("zb_four", 4), ("hybrid", 2)):  # hybrid: copy 0 holds the weights
        _, model_dir, proc = runs[name]
        backup = os.path.join(model_dir, "backup")
        index = sorted(f for f in os.listdir(backup) if f.endswith(".npz"))[-1]
        with np.load(os.path.join(backup, index)) as npz:
            assert npz.files == ["meta"]
            record = json.loads(npz["meta"].tobytes().decode())
        assert [p["name"] for p in record["parts"]] == [f"worker-{i}" for i in range(tasks)]
        parts_dir = os.path.join(backup, record["parts_dir"])
        assert sorted(os.listdir(parts_dir)) == sorted(
            f for p in record["parts"] for f in p["files"])
        table = dict((layer, device.split("/")[0]) for layer, device in
                     _rows(proc.stdout))  # layer -> "task:K"
        paths = {f"model_{i}": sig[0] for i, sig in enumerate(record["model_signature"])}
        for part in record["parts"]:
            task = "task:" + part["name"].split("-")[1]
            layers = {paths[k].split("/")[0] for k in part["keys"] if k in paths}
            assert layers and all(table[layer] == task for layer in layers
                                  if layer in table), (part, table)
        # Every variable is in exactly one part.
        keys = [k for p in record["parts"] for k in p["keys"]]
        assert sorted(keys) == sorted(set(keys)) and set(paths) <= set(keys)


def test_the_chief_saves_the_plain_model_with_the_trained_weights(runs):
    weights, model_dir, _ = runs["zb_four"]
    proc = run_py(["-c", "import sys, keras, numpy as np; m = keras.models.load_model(sys.argv[1]);"
                         "print(type(m).__name__, np.sum([np.abs(w).sum() for w in "
                         "m.get_weights()]))", os.path.join(model_dir, "model.keras")],
                  timeout=120)
    assert proc.returncode == 0, tail(proc)
    kind, total = proc.stdout.split()[-2:]
    assert kind == "Functional"
    assert float(total) == pytest.approx(sum(float(np.abs(w).sum()) for w in weights), rel=1e-6)


def test_the_sharded_final_weights_load_with_keras_alone(runs):
    weights, model_dir, proc = runs["two_tp"]
    assert "model.weights.json (sharded weights)" in proc.stdout
    assert not os.path.exists(os.path.join(model_dir, "model.keras"))
    script = ("import sys, keras, numpy as np; d = sys.argv[1]; "
              "m = keras.models.model_from_json(open(d + '/model.json').read()); "
              "m.load_weights(d + '/model.weights.json'); "
              "np.savez(d + '/loaded.npz', *m.get_weights())")
    loaded = run_py(["-c", script, model_dir], timeout=120)
    assert loaded.returncode == 0, tail(loaded)
    with np.load(os.path.join(model_dir, "loaded.npz")) as npz:
        arrays = [npz[f"arr_{i}"] for i in range(len(npz.files))]
    assert len(arrays) == len(weights)
    for a, b in zip(arrays, weights):
        np.testing.assert_array_equal(a, b)


def test_the_newest_backup_exports_to_either_form_with_the_final_weights(runs, tmp_path):
    # The tensor-parallel stages' backup (shards of each weight, on two tasks) as the
    # plain model, one weight at a time; its newest backup is the last step's.
    weights, model_dir, _ = runs["two_tp"]
    script = ("import sys, keras, numpy as np; d = sys.argv[1]; "
              "m = (keras.saving.load_model(d + '/model.keras') if sys.argv[2] == 'keras' else "
              "keras.models.model_from_json(open(d + '/model.json').read())); "
              "sys.argv[2] == 'keras' or m.load_weights(d + '/model.weights.json'); "
              "np.savez(d + '/loaded.npz', *m.get_weights())")
    for form in ("sharded", "keras"):
        out = str(tmp_path / form)
        proc = run_py(["-m", "tfdist.export", model_dir, "--form", form, "--out", out],
                      timeout=120)
        assert proc.returncode == 0, tail(proc)
        assert "ckpt-0000000022.npz (step 22)" in proc.stdout, proc.stdout
        assert not [n for n in os.listdir(out) if n.startswith(".export-")]
        loaded = run_py(["-c", script, out, form], timeout=120)
        assert loaded.returncode == 0, tail(loaded)
        with np.load(os.path.join(out, "loaded.npz")) as npz:
            arrays = [npz[f"arr_{i}"] for i in range(len(npz.files))]
        assert len(arrays) == len(weights)
        for a, b in zip(arrays, weights):
            np.testing.assert_array_equal(a, b)


def _start_stages(dump, model_dir, delay_ms, extra=()):
    """Two stage tasks started by hand (no launcher to stop the chief)."""
    procs = []
    for i, cfg in enumerate(worker_tf_configs(free_ports(2))):
        faults = ["--step-delay-ms", str(delay_ms)] if i == 0 else []
        procs.append(subprocess.Popen(
            [sys.executable, DUMP, dump, *faults, *ARGS, *RUNS["two"][1], *extra,
             "--model-dir", model_dir], env=clean_env(TF_CONFIG=json.dumps(cfg)), cwd=REPO,
            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    return procs


def _interrupt(dump, model_dir, sig, extra=()):
    """Starts the two stages, `sig` to stage 1 once a backup exists; (chief's stderr, s waited)."""
    chief, stage = _start_stages(dump, model_dir, delay_ms=50, extra=extra)
    try:
        backups = os.path.join(model_dir, "backup")
        def indexes():  # a backup is its index: part directories appear before it
            return {f for f in os.listdir(backups) if f.endswith(".npz")}

        before = indexes() if os.path.isdir(backups) else set()
        wait_for_checkpoint(model_dir, alive=lambda: chief.poll() is None, what="the chief")
        while indexes() <= before:  # a backup of this run, not the last one's
            assert chief.poll() is None, chief.communicate()[1][-3000:]
            time.sleep(0.05)
        stage.send_signal(sig)
        sent = time.monotonic()
        _, err = chief.communicate(timeout=120)
        waited = time.monotonic() - sent
    finally:
        for p in (chief, stage):
            p.kill() if p.poll() is None else None  # SIGKILL ends a stopped process too
            p.communicate()
    assert chief.returncode == exit_codes.PEER_LOST, err[-3000:]
    return err, waited


def test_a_killed_or_stopped_stage_ends_the_job_naming_it_and_reruns_resume_to_the_same_weights(
        runs, tmp_path):
    model_dir, dump = str(tmp_path / "model"), str(tmp_path / "dump")
    err, waited = _interrupt(dump, model_dir, signal.SIGKILL)
    assert waited < 30
    assert "lost contact with pipeline stage 1 (127.0.0.1:" in err, err[-3000:]
    assert "rerun the same command to resume" in err

    # A stopped stage (a hung host) keeps its port open: the watchdog's op probe finds it.
    err, waited = _interrupt(dump, model_dir, signal.SIGSTOP, ["--collective-timeout-s", "4"])
    assert waited < 30, err[-3000:]
    assert "lost contact with pipeline stage 1 (127.0.0.1:" in err, err[-3000:]
    assert "did not answer an op" in err and "Rerun the same command" in err

    chief, stage = _start_stages(dump, model_dir, delay_ms=0)  # the same command again
    out, err = chief.communicate(timeout=240)
    stage.communicate(timeout=60)
    assert chief.returncode == 0 and stage.returncode == 0, err[-3000:]
    assert "resumed from" in out
    for a, b in zip(_weights(dump), runs["two"][0]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_backup_resumes_split_another_way_or_unsplit_with_the_same_math(runs, tmp_path):
    """One more epoch: the 2-stage run's backup resumed in one process, the
    one-process run's backup resumed as 4 stage processes, and the 4 stage
    processes' backup resumed on 2, on 2 copies x 2 stages and in one process,
    end alike."""
    extended = override(ARGS, "--epochs", "3")
    ends = {}
    for name, n, extra in (("two", 1, ["--strategy", "single"]),
                           ("single", 4, [*PIPELINE, "--microbatches", "2"])):
        dump = str(tmp_path / name)
        command = [DUMP, dump, *extended, *extra, "--model-dir", runs[name][1]]
        if n > 1:
            command = ["-m", "tfdist.launch", "-n", str(n), "--timeout", "240", "--",
                       sys.executable, *command]
        proc = run_py(command, timeout=300)
        assert proc.returncode == 0, tail(proc)
        assert "resumed from" in proc.stdout and "epoch 2, step 0 of 22" in proc.stdout, \
            tail(proc)
        ends[name] = _weights(dump)
    for a, b in zip(ends["two"], ends["single"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    moved = max(float(np.abs(a - b).max()) for a, b in zip(ends["two"], runs["two"][0]))
    assert moved > 1e-3  # the third epoch trained

    # #40: the 4 stage processes' backup (a part per task) resumed on 2 stage processes,
    # on 2 copies x 2 stages, and in one process (each task, or the one process, reading
    # the parts it needs).
    legs = {"four_two": (2, [*PIPELINE, "--microbatches", "2"], "num_replicas=1 stages=2"),
            "four_copies": (4, [*PIPELINE, "--stages", "2", "--microbatches", "2"],
                            "stages=2 copies=2"),
            "four_one": (1, ["--strategy", "single"], "strategy=single")}
    commands = []
    for name, (n, extra, _) in legs.items():
        model_dir = str(tmp_path / f"{name}_model")
        shutil.copytree(runs["zb_four"][1], model_dir)
        command = [DUMP, str(tmp_path / name), *extended, *extra, "--model-dir", model_dir]
        if n > 1:
            command = ["-m", "tfdist.launch", "-n", str(n), "--timeout", "240", "--",
                       sys.executable, *command]
        commands.append(command)
    for (name, (_, _, layout)), proc in zip(legs.items(), run_py_many(commands, timeout=300)):
        assert proc.returncode == 0, (name, tail(proc))
        assert "resumed from" in proc.stdout and layout in proc.stdout, (name, tail(proc))
        for a, b in zip(_weights(str(tmp_path / name)), ends["single"]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)

    # #40: a backup written by 2 copies x 2 stages x tensor parallel 2 (each stage task's
    # own part) resumed as 4 stage processes without tensor parallelism: each variable
    # read on its own task, the shards joined there; the second epoch then ends with one
    # process's 2 epochs. atol 2e-6: the first epoch's row-parallel sums (see "hybrid"),
    # which Adam amplifies in the second to 1.24e-6 on one weight of 1e-3 (1.2 allowances).
    dump = str(tmp_path / "hybrid")
    proc = run_py(["-m", "tfdist.launch", "-n", "4", "--timeout", "240", "--", sys.executable,
                   DUMP, dump, *ARGS, *PIPELINE, "--microbatches", "2",
                   "--model-dir", runs["hybrid"][1]], timeout=300)
    assert proc.returncode == 0, tail(proc)
    assert "resumed from" in proc.stdout and "epoch 1, step 0 of 22" in proc.stdout, tail(proc)
    assert "num_replicas=1 stages=4 copies=1" in proc.stdout
    for a, b in zip(_weights(dump), runs["single"][0]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-6)


def test_a_stage_killed_under_the_launcher_ends_it_with_the_lost_peer_status(tmp_path):
    """tfdist.launch exits 4, as the chief does and the README says, whoever it sees end
    first (the SIGKILLed stage, by a signal)."""
    import re

    model_dir = str(tmp_path / "model")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tfdist.launch", "-n", "2", "--", sys.executable, DUMP,
         str(tmp_path / "dump"), "--step-delay-ms", "50", *ARGS, *RUNS["two"][1],
         "--model-dir", model_dir], cwd=REPO, env=clean_env(), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        pid = None
        for line in launcher.stdout:  # "[worker 1] tfdist: pipeline stage 1 serving at ... (pid N)"
            found = re.search(r"^\[worker 1\] tfdist: pipeline stage 1 serving .*\(pid (\d+)\)",
                              line)
            if found:
                pid = int(found.group(1))
                break
        assert pid, launcher.communicate()[1][-3000:]
        wait_for_checkpoint(model_dir, alive=lambda: launcher.poll() is None, what="the job")
        os.kill(pid, signal.SIGKILL)
        out, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    assert launcher.returncode == exit_codes.PEER_LOST, err[-3000:]
    assert "worker 1 failed (killed by SIGKILL)" in err, err[-3000:]
