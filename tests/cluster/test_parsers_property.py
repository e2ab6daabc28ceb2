"""Property-based: no environment escapes cluster discovery as anything but ClusterError.

Each parser gets both random junk and near-valid values (the mistakes a person
or a scheduler really makes); whatever is accepted must be self-consistent.
"""

import json
import string

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tfdist.cluster import detect, ports
from tfdist.cluster.slurm import expand_hostlist, expand_tasks_per_node
from tfdist.errors import ClusterError

SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
# Digits that Python's int() takes but no launcher writes, and text people paste.
ODD = ["²", "٣", "１", "1_0", " 1", "1 ", "-1", "+1", "0x1", "1e3", "", "9" * 30, "9" * 5000]
numbers = st.one_of(st.integers(0, 70000).map(str), st.sampled_from(ODD), st.text(max_size=6))


def _check(info):
    assert 1 <= info.num_workers
    if info.task_type in ("chief", "worker"):
        assert 0 <= info.worker_index < info.num_workers
    if info.tf_config is not None:
        json.dumps(info.tf_config)  # TensorFlow gets it as JSON
        for address in info.worker_addresses:
            port = int(address.rpartition(":")[2])
            assert 0 < port < 65536


# --- TF_CONFIG --------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=8)
addresses = st.one_of(
    st.sampled_from(["a:1", "A:1", "a:01", "127.0.0.1:2222", "127.000.0.1:2222", "[::1]:2222",
                     "::1:2222", "[::1]", "[fe80::1%eth0]:1", "h:0", "h:65536", "h:٣", "é:1",
                     "a b:1", ":1", "h:", "[::g]:1"]),
    st.text(max_size=12), json_values)
jobs = st.sampled_from(["chief", "worker", "ps", "evaluator", "boss", ""])


@st.composite
def mutated_tf_config(draw):
    """A valid TF_CONFIG with one or two fields replaced by a mistake."""
    n = draw(st.integers(1, 3))
    cluster = {"worker": [f"h{i}:{2000 + i}" for i in range(n)]}
    for job in draw(st.sets(st.sampled_from(["chief", "ps", "evaluator"]))):
        cluster[job] = [f"{job}:{3000 + len(cluster)}"]
    config = {"cluster": cluster, "task": {"type": "worker", "index": draw(st.integers(0, n - 1))}}
    for _ in range(draw(st.integers(1, 2))):
        where = draw(st.sampled_from(["type", "index", "address", "job", "drop"]))
        if where in ("type", "index"):
            config["task"][where] = draw(st.one_of(jobs, json_values, st.integers(-1, 4)))
        elif where == "address":
            job = draw(st.sampled_from(sorted(cluster)))
            if isinstance(cluster[job], list) and cluster[job]:
                cluster[job][0] = draw(addresses)
        elif where == "job":
            cluster[draw(jobs)] = draw(st.one_of(st.lists(addresses, max_size=3), json_values))
        else:
            config["task"].pop(draw(st.sampled_from(["type", "index"])), None)
    return config


near_valid_tf_config = st.fixed_dictionaries({
    "cluster": st.one_of(
        st.dictionaries(jobs, st.lists(addresses, min_size=0, max_size=3), max_size=4),
        json_values),
    "task": st.one_of(
        st.fixed_dictionaries({"type": st.one_of(jobs, json_values),
                               "index": st.one_of(st.integers(-2, 4), json_values)}),
        st.dictionaries(st.sampled_from(["type", "index"]), json_values, max_size=2),
        json_values),
})


@SETTINGS
@given(st.one_of(mutated_tf_config().map(json.dumps), near_valid_tf_config.map(json.dumps),
                 json_values.map(json.dumps), st.text(max_size=40)))
def test_tf_config_is_parsed_or_refused(text):
    assume(text.strip())
    try:
        info = detect({"TF_CONFIG": text})
    except ClusterError as e:
        assert str(e).startswith("Invalid TF_CONFIG: ") and "\nHINT: " in str(e)
        return
    _check(info)
    assert info.source == "tf_config" and info.task_type != "evaluator"


# --- Slurm ----------------------------------------------------------------------------

hostlist_text = st.text(alphabet="n0129[],-x \tab_.٣", max_size=20)


@SETTINGS
@given(hostlist_text)
def test_node_lists_expand_or_raise_value_error(text):
    try:
        hosts = expand_hostlist(text)
    except ValueError:
        return
    assert hosts and all(h and set(h) <= set(string.ascii_letters + string.digits + "_.-")
                         for h in hosts)


@SETTINGS
@given(st.text(alphabet="0123456789(x),²", max_size=24))
def test_tasks_per_node_expands_or_raises_value_error(text):
    try:
        counts = expand_tasks_per_node(text)
    except ValueError:
        return
    assert counts and len(counts) <= 65536


slurm_env = st.fixed_dictionaries(
    {"SLURM_JOB_ID": numbers, "SLURM_PROCID": numbers, "SLURM_NTASKS": numbers},
    optional={"SLURM_STEP_ID": numbers, "SLURM_LOCALID": numbers,
              "SLURM_STEP_NODELIST": st.one_of(hostlist_text, st.just("n[1-2]")),
              "SLURM_STEP_TASKS_PER_NODE": st.one_of(st.text("0123456789(x),", max_size=12),
                                                     st.just("2(x2)")),
              "SLURMD_NODENAME": st.sampled_from(["n1", "n2", "x"]),
              "TFDIST_PORT_BASE": numbers, "SLURM_STEP_RESV_PORTS": st.text("0123456789-,x",
                                                                            max_size=12),
              "TFDIST_NUM_PS": numbers})


@SETTINGS
@given(slurm_env)
def test_slurm_env_is_parsed_or_refused(env):
    try:
        info = detect(env)
    except ClusterError as e:
        assert "\nHINT: " in str(e) or str(e).startswith(("SLURM", "A parameter-server",
                                                          "At most"))
        return
    _check(info)


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_derived_ports_stay_below_the_ephemeral_range(job, step):
    base = ports.derived_base(job, step)
    assert 1024 <= base and base + ports.SPAN - 1 < ports.EPHEMERAL[0]


# --- Horovod / OpenMPI ------------------------------------------------------------------

HVD_VARS = ["HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"]


@SETTINGS
@given(st.dictionaries(st.sampled_from(HVD_VARS), st.one_of(
    st.integers(0, 4).map(str), st.sampled_from(ODD)), max_size=6),
       st.sampled_from([{}, {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "1",
                            "SLURM_STEP_ID": "0", "SLURM_LOCALID": "0",
                            "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "1"}]))
def test_horovod_env_is_parsed_or_refused(env, slurm):
    try:
        info = detect({**slurm, **env})
    except ClusterError as e:
        assert "\nHINT: " in str(e)
        return
    _check(info)
    if any(v in env for v in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK")):
        assert info.source == "horovod"  # never a lone chief
