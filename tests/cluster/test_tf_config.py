"""TF_CONFIG parsing and validation, with a cleared environment."""

import json

import pytest

from tfdist.cluster import detect
from tfdist.errors import ClusterError


def _env(config):
    return {"TF_CONFIG": config if isinstance(config, str) else json.dumps(config)}


def test_workers_only_numbering_worker0_is_chief():
    cfg = {"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]},
           "task": {"type": "worker", "index": 0}}
    info = detect(_env(cfg))
    assert (info.source, info.num_workers, info.worker_index, info.is_chief) == (
        "tf_config", 3, 0, True)
    cfg["task"]["index"] = 2
    info = detect(_env(cfg))
    assert (info.worker_index, info.is_chief) == (2, False)
    assert json.loads(info.tf_config_json()) == cfg


def test_chief_is_worker_zero_and_workers_shift():
    cluster = {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"]}
    chief = detect(_env({"cluster": cluster, "task": {"type": "chief", "index": 0}}))
    w0 = detect(_env({"cluster": cluster, "task": {"type": "worker", "index": 0}}))
    assert (chief.num_workers, chief.worker_index, chief.is_chief) == (3, 0, True)
    assert (w0.worker_index, w0.is_chief, w0.hostname) == (1, False, "h1")


def test_ps_is_not_a_training_worker():
    cluster = {"chief": ["h0:1"], "worker": ["h1:1"], "ps": ["h2:1"]}
    ps = detect(_env({"cluster": cluster, "task": {"type": "ps", "index": 0}}))
    assert ps.num_workers == 2 and not ps.is_chief and ps.task_type == "ps"


@pytest.mark.parametrize("config, message", [
    ("{not json", r"not valid JSON .*Received: '\{not json'"),
    ("[1, 2]", r"top level must be an object. Received: list"),
    ({"task": {"type": "worker", "index": 0}}, r"missing field 'cluster'"),
    ({"cluster": {"worker": ["a:1"]}}, r"missing field 'task'"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}},
     r"task.type 'chief' is not a task type in cluster \['worker'\]"),
    ({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}},
     r"task.index 2 is out of range for cluster.worker, which has 2 address"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "0"}},
     r"task.index must be a JSON integer \(tfdist is stricter than TensorFlow here\)\. "
     r"Received: '0'"),
    # Issue 13: TensorFlow's own rules.
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": ["worker"], "index": 0}},
     r"task.type must be a string naming a job of the cluster \['worker'\]\. Received: "
     r"\['worker'\]"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": {"a": 1}, "index": 0}},
     r"task.type must be a string"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}},
     r"task.index is missing \(TensorFlow requires it too\)"),
    ({"cluster": {"worker": ["a:1"], "evaluator": ["e:1", "f:1"]},
      "task": {"type": "worker", "index": 0}}, r"cluster.evaluator must list exactly one"),
    ({"cluster": {"worker": ["a:1"], "evaluator": ["e:1"]},
      "task": {"type": "evaluator", "index": 0}}, r"task.type 'evaluator': tfdist has no "
                                                  r"side-car evaluator"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "evaluator", "index": 0}},
     r"task.type 'evaluator'"),
    ({"cluster": {"worker": ["::1:2222"]}, "task": {"type": "worker", "index": 0}},
     r"looks like an IPv6 address without brackets; write '\[::1\]:2222'"),
    ({"cluster": {"worker": ["[::g]:2222"]}, "task": {"type": "worker", "index": 0}},
     r"invalid IPv6 address in brackets"),
    ({"cluster": {"worker": ["Host:2222", "host:2222"]}, "task": {"type": "worker", "index": 0}},
     r"duplicate address 'host:2222' in cluster.worker\[0\] \(as 'Host:2222'\) and "
     r"cluster.worker\[1\]"),
    ({"cluster": {"worker": ["h:2222", "h:02222"]}, "task": {"type": "worker", "index": 0}},
     r"duplicate address 'h:02222'"),
    ({"cluster": {"worker": ["[::1]:1", "[0:0::1]:1"]}, "task": {"type": "worker", "index": 0}},
     r"duplicate address '\[0:0::1\]:1'"),
    ({"cluster": {"worker": ["127.000.0.1:1"]}, "task": {"type": "worker", "index": 0}},
     r"leading zeros, which some resolvers read as octal; write 127.0.0.1"),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": ' + "9" * 5000 + "}}",
     r"not valid JSON \(Exceeds the limit"),
    ({"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}},
     r"duplicate address 'a:1' in cluster.worker\[0\] and cluster.worker\[1\]"),
    ({"cluster": {"chief": ["a:1"], "worker": ["a:1"]}, "task": {"type": "worker", "index": 0}},
     r"duplicate address 'a:1' in cluster.chief\[0\] and cluster.worker\[0\]"),
    ({"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief", "index": 0}},
     r"cluster.chief must list exactly one address"),
    ({"cluster": {"worker": ["nohost"]}, "task": {"type": "worker", "index": 0}},
     r"cluster.worker\[0\] must be a 'host:port' string. Received: 'nohost'"),
    ({"cluster": {"worker": ["a:99999"]}, "task": {"type": "worker", "index": 0}},
     r"port in 1-65535. Received: 'a:99999'"),
    ({"cluster": {"boss": ["a:1"]}, "task": {"type": "boss", "index": 0}},
     r"unknown task type 'boss'"),
    ({"cluster": {"worker": []}, "task": {"type": "worker", "index": 0}},
     r"cluster.worker must be a non-empty list"),
])
def test_bad_tf_config_names_field_and_value(config, message):
    with pytest.raises(ClusterError, match=message) as e:
        detect(_env(config))
    assert "HINT:" in str(e.value)


def test_ipv6_addresses_in_brackets():
    cfg = {"cluster": {"worker": ["[::1]:2222", "[::1]:2223"]},
           "task": {"type": "worker", "index": 1}}
    info = detect(_env(cfg))
    assert (info.num_workers, info.worker_index, info.hostname) == (2, 1, "::1")
    assert info.worker_addresses == ["[::1]:2222", "[::1]:2223"]


def test_evaluator_in_the_cluster_is_allowed_for_workers():
    cfg = {"cluster": {"worker": ["a:1", "b:1"], "evaluator": ["e:1"]},
           "task": {"type": "worker", "index": 1}}
    info = detect(_env(cfg))
    assert (info.num_workers, info.worker_index) == (2, 1)


def test_training_workers_of_a_parameter_server_job_are_its_worker_tasks():
    import json

    from tfdist.cluster import detect

    spec = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"],
            "ps": ["127.0.0.1:4"]}
    ps_job = detect({"TF_CONFIG": json.dumps({"cluster": spec,
                                              "task": {"type": "worker", "index": 0}})})
    assert ps_job.training_workers == 2
    sync = detect({"TF_CONFIG": json.dumps({"cluster": {"worker": spec["worker"]},
                                            "task": {"type": "worker", "index": 1}})})
    assert sync.training_workers == sync.num_workers == 2
