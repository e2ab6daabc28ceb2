"""The layout of a namespaced cluster, computed without root (tfdist.hosts.plan)."""

from __future__ import annotations

import ipaddress

import pytest

from tfdist.hosts import plan


def test_addresses_stay_in_the_benchmarking_range_and_clusters_do_not_overlap():
    first, last = plan.make_plan("a", 0, 3), plan.make_plan("b", plan.SUBNETS - 1, 200)
    assert [h.address for h in first.hosts] == ["198.18.0.1", "198.18.0.2", "198.18.0.3"]
    assert first.root_address == "198.18.0.254"
    assert last.hosts[-1].address == "198.19.255.200"
    for p in (first, last):
        for a in [p.root_address] + [h.address for h in p.hosts]:
            assert ipaddress.ip_address(a) in plan.RANGE
    nets = {ipaddress.ip_network(f"{plan.subnet_base(s)}/24") for s in range(plan.SUBNETS)}
    assert len(nets) == plan.SUBNETS
    assert not any(a.overlaps(b) for a in nets for b in nets if a is not b and a != b)


def test_names_fit_linux_limits_and_carry_the_cluster_name():
    p = plan.make_plan("a-very-long-name-20", 511, 200)
    for h in p.hosts:
        assert len(h.veth) <= 15 and len(h.peer) <= 15, h
        assert h.netns.startswith("a-very-long-name-20-h")
    assert len(p.bridge) <= 15
    assert p.host("h7").address == "198.19.255.8"
    with pytest.raises(ValueError, match=r"no host 'h200'.*\['h0'"):
        p.host("h200")


@pytest.mark.parametrize("bad", ["", "Tfdist", "1abc", "a" * 21, "a_b", "a b"])
def test_bad_cluster_names_are_refused_with_what_was_received(bad):
    with pytest.raises(ValueError, match="Received"):
        plan.check_name(bad)


def test_bad_host_counts_and_subnets_are_refused():
    with pytest.raises(ValueError, match="Received: 0"):
        plan.make_plan("a", 0, 0)
    with pytest.raises(ValueError, match="Received: 512"):
        plan.make_plan("a", 512, 2)


def test_free_subnet_skips_taken_ones_and_wraps():
    assert plan.free_subnet(set(), 5) == 5
    assert plan.free_subnet({5, 6}, 5) == 7
    assert plan.free_subnet({511}, 511) == 0
    with pytest.raises(ValueError, match="in use"):
        plan.free_subnet(set(range(plan.SUBNETS)))


def test_rates():
    assert plan.parse_rate("1gbit") == 10**9
    assert plan.parse_rate("10gbit") == 10**10
    assert plan.parse_rate("500mbit") == 5 * 10**8
    assert plan.parse_rate("none") is None and plan.parse_rate(None) is None
    for bad in ("1gb", "fast", "0gbit", "-1gbit"):
        with pytest.raises(ValueError, match="Received"):
            plan.parse_rate(bad)
    # The bucket always holds a 64 KiB offloaded segment, and 4 ms of traffic at high rates.
    assert plan.tbf_args(10**6)[4] == str(64 * 1024)
    assert plan.tbf_args(10**10)[:3] == ["tbf", "rate", "10000000000bit"]
    assert int(plan.tbf_args(10**10)[4]) == 10**10 // 8 // 250


def test_hosts_file_resolves_every_host():
    text = plan.hosts_file(plan.make_plan("a", 3, 2), own="h1")
    assert "198.18.3.1\th0\n" in text and "198.18.3.2\th1\n" in text
    assert text.startswith("127.0.0.1\tlocalhost\n")


def test_ssh_config_pins_keys_and_never_prompts():
    p = plan.make_plan("a", 0, 2)
    text = plan.ssh_config(p, "/s/id", "/s/known_hosts")
    assert "Host h1 198.18.0.2\n    HostName 198.18.0.2\n" in text
    for line in ("IdentityFile /s/id", "UserKnownHostsFile /s/known_hosts",
                 "StrictHostKeyChecking yes", "BatchMode yes", "User root"):
        assert line in text
    known = plan.known_hosts(p, "ssh-ed25519 AAAAkey host@a\n")
    assert known == "h0,198.18.0.1 ssh-ed25519 AAAAkey\nh1,198.18.0.2 ssh-ed25519 AAAAkey\n"


def test_sshd_listens_only_on_its_own_address_and_takes_keys_only():
    h = plan.make_plan("a", 0, 2).hosts[1]
    text = plan.sshd_config(h, "/s/hk", "/s/ak", "/s/h1/sshd.pid")
    assert "ListenAddress 198.18.0.2:22\n" in text
    assert "0.0.0.0" not in text
    assert "PasswordAuthentication no" in text and "PermitRootLogin prohibit-password" in text
