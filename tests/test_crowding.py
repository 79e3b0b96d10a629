"""A crowded host (more busy processes than cores): the model's waits per round and per peer
received from, solved by calibration from a pair of ranks alone and every rank busy; a job
across hosts' wait per round, solved from small all-reduces on every rank; and the margin a
schedule's prediction must beat a measured native collective by."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from calibration_kit import fake_comm, priced, probe_times

from collectives.algorithms import select
from collectives.algorithms.cost import Fabric, Link, Placement
from collectives.algorithms.sampling import predict
from collectives.algorithms.schedule import Collective
from collectives.api import calibration_crowds, calibration_links, calibration_measure

B = 1 << 20
A_H, BETA_H = 4e-6, 1 / 5e9
GAMMA, OVER, CALL = 1 / 8e9, 2e-6, 50e-6
FABRIC = Fabric(proc=Link(1e-6, 1 / 10e9), host=Link(A_H, BETA_H), net=Link(30e-6, 1 / 1e9),
                gamma=GAMMA, overhead=OVER, call_overhead=CALL)


def test_crowding_adds_a_wait_per_round_and_per_peer_where_processes_outnumber_the_cores():
    crowded = Fabric(host=Link(A_H, BETA_H), gamma=GAMMA, overhead=OVER, call_overhead=CALL,
                     cores=2, crowding=300e-6, crowding_message=100e-6)
    plain = Fabric(host=Link(A_H, BETA_H), gamma=GAMMA, overhead=OVER, call_overhead=CALL)
    # on 4: the ring's 6 rounds each receive from one peer; the shuffle's 2 from 3 each
    for name, rounds, peers in (("ring", 6, 6), ("shuffle", 2, 6), ("rechd", 4, 4)):
        for n, placement, factor in ((4, Placement(4), (4 - 2) / 2),
                                     (4, Placement(4, None, False), 0.0),  # threads
                                     (4, Placement.nodes(2, 2), 0.0),      # 2 per host: 2 cores
                                     (2, Placement(2), 0.0)):
            wait = (300e-6 * factor, 100e-6 * factor)
            assert crowded.crowd(placement) == pytest.approx(wait)
            got = predict(Collective.ALL_REDUCE, name, n, B, crowded, placement).seconds
            want = predict(Collective.ALL_REDUCE, name, n, B, plain, placement).seconds
            assert got == pytest.approx(want + rounds * wait[0] + peers * wait[1]), name
    six = Placement.nodes(1, 6)
    assert crowded.crowd(six) == pytest.approx((300e-6 * 2, 100e-6 * 2))
    assert Fabric.from_json(crowded.to_json()) == crowded
    # a file written before the per-peer term reads as none
    old = json.loads(crowded.to_json())
    del old["crowding_message"]
    assert Fabric.from_json(json.dumps(old)).crowding_message == 0.0
    # the per-peer wait makes one round of many peers dearer than fewer peers per round
    cheap = predict(Collective.ALL_REDUCE, "shuffle", 4, 4096, replace(
        crowded, crowding_message=0.0), Placement(4)).seconds
    dear = predict(Collective.ALL_REDUCE, "shuffle", 4, 4096, replace(
        crowded, crowding_message=1e-3), Placement(4)).seconds
    assert dear - cheap == pytest.approx(6 * 1e-3)


@pytest.mark.parametrize("n", [3, 4])
@pytest.mark.parametrize("per_round, per_peer", [(500e-6, 0.0), (100e-6, 400e-6),
                                                 (0.0, 300e-6)])
def test_crowding_is_solved_from_a_pair_alone_and_the_busy_host(n, per_round, per_peer):
    """Probes on every busy rank of a 2-core host cost waits per round and per peer more than
    the model of a pair alone says: the solved terms are those waits, give the busy probes
    back, and nothing more on 2; the host link is the pair's, its ``two_way`` from the busy
    streams (the pair times no one-way stream)."""
    alone = Fabric(host=Link(20e-6, 1 / 3e9, two_way=0.6), gamma=GAMMA, overhead=7e-6,
                   call_overhead=CALL)
    busy = replace(alone, cores=2, crowding=per_round, crowding_message=per_peer)
    pair = {k: v for k, v in probe_times(2, alone).items() if k != "oneway"}
    crowd = probe_times(n, busy)
    got = calibration_measure.solved_fabric(Fabric(), CALL, (("float32", GAMMA),), {"local": [crowd]},
                              (2, pair), (), fake_comm(n), {"local": (tuple(range(n)),)})
    assert got.cores == 2
    assert got.crowding == pytest.approx(per_round, rel=0.05, abs=5e-6)
    assert got.crowding_message == pytest.approx(per_peer, rel=0.05, abs=5e-6)
    assert got.host.alpha == pytest.approx(20e-6, rel=0.05)
    assert got.host.beta == pytest.approx(1 / 3e9, rel=0.05)
    assert got.host.two_way == pytest.approx(0.6, abs=0.03)
    assert got.overhead == pytest.approx(7e-6, rel=0.05)
    for k in (2, n):
        for name in ("one", "fan", "check.small", "big", "check.large"):
            algorithm, shards, nbytes = {**calibration_links.probes(k),
                                         **calibration_links.CHECKS}[name]
            want = (crowd if k == n else pair)[name]
            assert predict(Collective.ALL_REDUCE, algorithm, k, nbytes, got, Placement(k),
                           shards=shards).seconds == pytest.approx(want, rel=0.1)


def test_crowding_fits_no_negative_wait():
    """Busy probes no slower than the pair's constants say: no wait (never a negative one)."""
    alone = Fabric(host=Link(20e-6, 1 / 3e9), gamma=GAMMA, overhead=7e-6, call_overhead=CALL)
    times = probe_times(4, alone)
    faster = {k: v * 0.8 for k, v in times.items()}
    assert calibration_links.crowding(faster, alone.host, 7e-6, CALL, 4, 1.0) == (0.0, 0.0)
    slower = {**times, "fan": times["fan"] + 1e-3}  # only the many-peer round is slower
    per_round, per_peer = calibration_links.crowding(slower, alone.host, 7e-6, CALL, 4, 1.0)
    assert per_peer > 0 and per_round >= 0


def test_a_schedule_must_beat_a_measured_native_by_the_margin():
    """A schedule predicted cheaper than the measured native by less than NATIVE_MARGIN
    leaves the call to the native (a margin for the model's error), and explain says so;
    by more, it runs; a modelled (unmeasured) native gets no margin."""
    size, nbytes = 4, 1 << 20
    ring = predict(Collective.ALL_REDUCE, "ring", size, nbytes, FABRIC, Placement(size))
    schedules = select.decide(Collective.ALL_REDUCE, size, nbytes, FABRIC, Placement(size))
    cheapest = schedules.best.seconds
    assert cheapest <= ring.seconds
    for ahead, wins in ((0.5 * select.NATIVE_MARGIN, "native"),
                        (2 * select.NATIVE_MARGIN, schedules.name)):
        native = cheapest / (1 - ahead)  # the schedule is predicted `ahead` cheaper
        fabric = replace(FABRIC, measured=(("native", "all_reduce", size,
                                            ((nbytes, native),)),))
        got = select.decide(Collective.ALL_REDUCE, size, nbytes, fabric, Placement(size),
                            natives=("native",), payload=nbytes)
        assert got.name == wins, ahead
        if wins == "native":
            assert got.predictions[1].seconds < got.best.seconds
            assert "margin" in str(got) and "wins by -" not in str(got)
    modelled = select.decide(Collective.ALL_REDUCE, size, nbytes, FABRIC, Placement(size),
                             natives=("native",))
    assert modelled.best.note != "measured"


@pytest.mark.parametrize("hosts, per", [(2, 2), (3, 1), (4, 3)])
@pytest.mark.parametrize("wait", [0.0, 20e-6, 150e-6])
def test_a_job_across_hosts_gets_the_wait_per_round_its_small_all_reduces_measured(
        hosts, per, wait):
    """The job probes timed as the model prices them with a per-round wait: the wait comes
    back; timed as priced without one (hosts of their own), none is added."""
    placement = Placement.nodes(hosts, per)
    n = placement.size
    busy = replace(FABRIC, round_overhead=wait)
    times = priced(calibration_crowds.job_probes(n), busy, placement)
    assert calibration_crowds.round_wait(times, FABRIC, placement) == pytest.approx(wait, abs=1e-9)


def test_a_job_measured_faster_than_priced_gets_no_negative_wait():
    placement = Placement.nodes(2, 2)
    times = {name: 1e-6 for name in calibration_crowds.job_probes(4)}
    assert calibration_crowds.round_wait(times, FABRIC, placement) == 0.0
    assert calibration_crowds.round_wait({}, FABRIC, placement) == 0.0


def test_calibration_keeps_the_job_wait_and_its_probes():
    """``_fabric`` with job probes on every rank sets ``round_overhead`` from them and keeps
    their times with the raw numbers; without them it stays 0."""
    comm = fake_comm(4)
    comm.placement = Placement.nodes(2, 2)
    times = probe_times(2, FABRIC)
    net_times = probe_times(2, replace(FABRIC, host=FABRIC.net))  # (a pair over the net link)
    job = priced(calibration_crowds.job_probes(4), replace(FABRIC, round_overhead=40e-6),
                 comm.placement)
    groups = {"local": ((0, 1), (2, 3)), "net": ((0, 2),)}
    attempts = {"local": [times], "net": [net_times]}
    args = (Fabric(), CALL, (("float32", GAMMA),), attempts, (4, None), (), comm, groups)
    plain = calibration_measure.solved_fabric(*args)
    assert plain.round_overhead == 0.0
    waited = calibration_measure.solved_fabric(*args, job)
    assert waited.round_overhead == pytest.approx(40e-6, rel=0.05)
    assert dict(waited.raw)["job.ring"] == job["job.ring"]
