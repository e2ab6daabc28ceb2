"""`python -m tfdist.env [--json]`: what a bug report needs, in one listing.

Versions (Python, TensorFlow, Keras, NumPy, Horovod and its build flags, MPI),
devices, the cluster this process would join, the cluster-related variables
that are set, and whether Slurm and ssh are there. Horovod is looked for both
in this Python and in the venv `scripts/install_horovod.sh` makes (its
TensorFlow is older, so it usually lives there). Every probe that fails says
why instead of stopping the listing.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys

import tfdist

# Run by the Horovod venv's python: versions and build flags as one JSON line.
_HOROVOD_PROBE = (
    "import json, horovod, tensorflow as tf, horovod.tensorflow as hvd; "
    "print(json.dumps({'horovod': horovod.__version__, 'tensorflow': tf.__version__, "
    "'gloo': hvd.gloo_built(), 'mpi': hvd.mpi_built(), 'nccl': hvd.nccl_built(), "
    "'cuda': hvd.cuda_built(), 'rocm': hvd.rocm_built()}))")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _first_line(cmd: list[str], timeout_s: float = 20) -> str | None:
    """First non-empty output line of `cmd`, or None when it is missing or fails."""
    if not shutil.which(cmd[0]):
        return None
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"({cmd[0]} failed: {type(e).__name__})"
    lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    return lines[0] if lines else ""


def horovod_report(venv: str) -> dict:
    """Horovod in this Python and in `venv`: versions and build flags, or why not."""
    from tfdist.horovod import runtime

    out: dict = {"in_this_python": _version("horovod") if runtime.is_available() else None,
                 "venv": venv}
    python = os.path.join(venv, "bin", "python")
    if not os.access(os.path.join(venv, "bin", "horovodrun"), os.X_OK):
        # A venv without Horovod in it (an interrupted or failed build) is not "not found".
        found = ("exists without Horovod (no bin/horovodrun)" if os.access(python, os.X_OK)
                 else "not found")
        out["venv_status"] = (f"{found}: run scripts/install_horovod.sh (or set "
                              "TFDIST_HOROVOD_VENV)")
        return out
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("PYTHONPATH", None)  # the venv's own packages, not this checkout's
    try:
        proc = subprocess.run([python, "-c", _HOROVOD_PROBE], capture_output=True, text=True,
                              timeout=180, env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        out["venv_status"] = f"probe failed: {type(e).__name__}: {e}"
        return out
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        out["venv_status"] = f"import failed (exit {proc.returncode}): {tail[:300]}"
        return out
    out["venv_status"] = "ok"
    out["venv_build"] = json.loads(lines[-1])
    return out


def cluster_report() -> dict:
    """The cluster this process would join, or the error that discovery raises."""
    from tfdist import cluster
    from tfdist.errors import ClusterError

    try:
        info = cluster.detect()
    except ClusterError as e:
        return {"error": str(e)}
    return {"source": info.source, "num_workers": info.num_workers,
            "worker_index": info.worker_index, "task": f"{info.task_type} {info.task_index}",
            "is_chief": info.is_chief, "workers": info.worker_addresses,
            "hostname": info.hostname or platform.node()}


def devices_report() -> dict:
    """TensorFlow's physical devices by type (imports TensorFlow quietly)."""
    from tfdist.compat.tf_startup_logs import import_tensorflow

    tf = import_tensorflow()
    devices: dict[str, list[str]] = {}
    for d in tf.config.list_physical_devices():
        devices.setdefault(d.device_type, []).append(d.name)
    return {"tensorflow_devices": devices, "cpu_count": os.cpu_count(),
            "built_with_cuda": tf.test.is_built_with_cuda()}


def collect() -> dict:
    """Everything `python -m tfdist.env` prints, as a dict."""
    from tfdist import cluster

    return {
        "tfdist": {"version": tfdist.__version__,
                   "path": os.path.dirname(os.path.abspath(tfdist.__file__))},
        "python": {"version": platform.python_version(), "executable": sys.executable,
                   "platform": platform.platform()},
        "packages": {name: _version(name) for name in
                     ("tensorflow", "tensorflow-cpu", "keras", "numpy", "scikit-learn",
                      "tensorboard")},
        "horovod": horovod_report(cluster.horovod_venv()),
        "mpi": _first_line(["mpirun", "--version"]),
        "devices": devices_report(),
        "cluster": cluster_report(),
        "environment": cluster.reported_environment(),
        "slurm": {tool: shutil.which(tool) for tool in ("sbatch", "srun", "sinfo")} | {
            "sinfo": _first_line(["sinfo", "-h", "-o", "%P %a %D %T %c cpus"], 10)},
        "ssh": {"ssh": shutil.which("ssh"), "sshd": shutil.which("sshd")
                or (os.path.exists("/usr/sbin/sshd") and "/usr/sbin/sshd") or None},
    }


def render(report: dict) -> str:
    """Pure function: the report as indented `key: value` lines ("none" for an empty section)."""
    lines = []

    def walk(obj, indent):
        for key, value in obj.items():
            if isinstance(value, dict) and not value:  # nothing set: say so, no bare heading
                lines.append(f"{'  ' * indent}{key}: none")
            elif isinstance(value, dict):
                lines.append(f"{'  ' * indent}{key}:")
                walk(value, indent + 1)
            else:
                shown = "-" if value is None else value
                lines.append(f"{'  ' * indent}{key}: {shown}")

    walk(report, 0)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m tfdist.env",
        description="Print versions, devices, the discovered cluster and the tools found: "
                    "paste it into a bug report.")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of text")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    report = collect()
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
