"""Shared fixtures: environment hygiene and real-process helpers."""

from __future__ import annotations

import contextlib
import multiprocessing.util
import os
import subprocess
import sys
import uuid

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKERS = os.path.join(REPO, "tests", "workers")


# Variables that decide where a process thinks it is; a test that leaves one
# changed would silently change what the tests after it detect.
_WATCHED = ("TF_CONFIG", "SLURM_", "TFDIST_", "CUDA_VISIBLE_DEVICES", "HOROVOD_", "OMPI_")


@pytest.fixture(autouse=True)
def no_env_leaks():
    """Fails any test that leaves a cluster-related environment variable changed."""
    before = dict(os.environ)
    yield
    after = dict(os.environ)
    changed = {k for k in before.keys() | after.keys()
               if before.get(k) != after.get(k) and k.startswith(_WATCHED)}
    for k in changed:
        if k in before:
            os.environ[k] = before[k]
        else:
            del os.environ[k]
    assert not changed, f"test leaked environment variables: {sorted(changed)}"


# Every way a test could start a process from Python: subprocess, a bare fork or
# spawn, and multiprocessing's helpers (its resource tracker, which
# shared_memory starts, goes through spawnv_passfds, not subprocess).
_PROCESS_STARTERS = ((subprocess.Popen, "__init__"), (os, "fork"), (os, "posix_spawn"),
                     (os, "posix_spawnp"), (os, "system"),
                     (multiprocessing.util, "spawnv_passfds"))


# Read-only lookups that libraries make the first time they are imported in a process
# (platform.processor runs `uname -p`, ctypes.util.find_library `ldconfig -p`): which
# test pays for them depends on the selection, so they are not the test's processes.
_LIBRARY_PROBES = ("uname", "ldconfig")


@pytest.fixture(autouse=True)
def fast_tier_starts_no_process(request):
    """Fails a test outside the `integration` tier that starts a process.

    The fast tier (`pytest -m "not integration"`) is for every edit: it must
    start no worker, launcher or interpreter. Mark such a test integration.
    """
    if request.node.get_closest_marker("integration"):
        yield
        return

    def guard(name, original):
        def refuse(*args, **kwargs):
            command = args[1] if name == "__init__" and len(args) > 1 else None
            if isinstance(command, (list, tuple)) and command and \
                    os.path.basename(str(command[0])) in _LIBRARY_PROBES:
                return original(*args, **kwargs)
            raise AssertionError(
                f"a test outside the integration tier started a process: {args[1:2] or args!r}. "
                "Mark it @pytest.mark.integration (the fast tier starts none).")
        return refuse

    # Patched by hand, not with monkeypatch: autouse fixtures are set up in name
    # order, so a monkeypatch taken here would be set up before no_env_leaks and
    # undo a test's setenv only after no_env_leaks had reported it as a leak.
    originals = [(owner, name, getattr(owner, name)) for owner, name in _PROCESS_STARTERS
                 if hasattr(owner, name)]
    for owner, name, original in originals:
        setattr(owner, name, guard(name, original))
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def clean_env(**extra) -> dict:
    """os.environ without cluster variables, quiet TensorFlow, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM_") and k != "TF_CONFIG"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", PYTHONHASHSEED="0")
    # Worker scripts in tests/workers must import this checkout's tfdist, not
    # whichever checkout `pip install -e` last pointed at.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def override(args: list[str], *extra: str) -> list[str]:
    """`args` + `extra`, where an option in `extra` replaces the same option in `args`.

    tfdist refuses an option given twice, so a test's variant of a common
    command line must not just append. Options are `--key value`, `--key=value`
    or a bare `--flag`; other tokens (a recipe, a script's own arguments) stay.
    """
    def split(tokens):
        items, i = [], 0
        while i < len(tokens):
            token = tokens[i]
            has_value = (token.startswith("--") and "=" not in token and i + 1 < len(tokens)
                         and not tokens[i + 1].startswith("--"))
            key = token.split("=")[0] if token.startswith("--") else None
            items.append((key, tokens[i:i + 2] if has_value else [token]))
            i += 2 if has_value else 1
        return items

    def key_of(key):  # --no-flag and --flag are the same option
        return key[5:] if key and key.startswith("--no-") else key and key[2:]

    new = split(list(extra))
    replaced = {key_of(k) for k, _ in new if k}
    kept = [t for k, tokens in split(list(args)) if not (k and key_of(k) in replaced)
            for t in tokens]
    return kept + [t for _, tokens in new for t in tokens]


def run_py(args: list[str], timeout: float = 240, env: dict | None = None,
           cwd: str | None = None) -> subprocess.CompletedProcess:
    """Runs `python ARGS` in a subprocess and returns the completed process."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, env=env or clean_env(), cwd=cwd or REPO)


def run_py_many(commands: list[list[str]], parallel: int = 2, timeout: float = 300,
                envs: list[dict | None] | None = None) -> list[subprocess.CompletedProcess]:
    """`run_py` for each command (with its env from `envs`, if given), `parallel` at a
    time (one per core for `--threads 1` runs)."""
    from concurrent.futures import ThreadPoolExecutor

    envs = envs or [None] * len(commands)
    with ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(lambda args, env: run_py(args, timeout=timeout, env=env),
                             commands, envs))


def wait_for_checkpoint(model_dir: str, alive=lambda: True, seconds: float = 240,
                        what: str = "the run") -> None:
    """Waits until MODEL_DIR/backup holds a checkpoint, failing if `alive()` turns False.

    A checkpoint, not any file: the chief's start-up probe writes (and removes)
    `.probe.PID` in backup/ before training, when a signal or fault would land
    before the run can save (the race that once failed a Slurm job in CI).
    """
    import time

    backup = os.path.join(model_dir, "backup")
    deadline = time.monotonic() + seconds
    while not (os.path.isdir(backup) and any(
            f.startswith("ckpt-") and f.endswith(".npz") for f in os.listdir(backup))):
        if not alive():
            pytest.fail(f"{what} ended before its first checkpoint in {backup}")
        if time.monotonic() > deadline:
            pytest.fail(f"no checkpoint in {backup} after {seconds:.0f} s of {what}")
        time.sleep(0.05)


def tail(proc: subprocess.CompletedProcess, n: int = 3000) -> str:
    """The end of a process's output, for assertion messages."""
    return f"rc={proc.returncode}\nSTDOUT:\n{proc.stdout[-n:]}\nSTDERR:\n{proc.stderr[-n:]}"


@contextlib.contextmanager
def namespaced_hosts(num_hosts: int, rate: str | None = None, prefix: str = "t"):
    """A `tfdist.hosts.HostRig` of `num_hosts` hosts under a unique name, always torn down.

    Skips, saying why, when namespaces cannot be made here; under CI (CI set)
    that is a failure instead.
    """
    from tfdist.hosts import HostRig, unavailable

    reason = unavailable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs namespaced hosts: {reason}")
        pytest.skip(reason)
    name = f"{prefix}{os.getpid() % 100000}-{uuid.uuid4().hex[:6]}"
    cluster = HostRig(name)
    try:
        yield cluster.up(num_hosts, rate=rate)
    finally:
        cluster.down()
