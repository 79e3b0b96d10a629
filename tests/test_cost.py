"""The cost model: small cases priced by hand, its shortcuts against pricing every
participant, the cost of choosing at scale (counted in plans and bytes, not timed), the
choice among candidates, calibration on thread ranks, and the CLI commands."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest
from calibration_kit import fake_comm, priced, probe_times

import collectives
from collectives import algorithms
from collectives.algorithms import select
from collectives.algorithms.cost import Fabric, Link, Placement
from collectives.algorithms.native_prices import interpolate, predict_native
from collectives.algorithms.sampling import predict
from collectives.algorithms.schedule import Collective
from collectives.api import calibration, calibration_links, calibration_measure
from collectives.tools import cli

B = 1 << 20
A_H, BETA_H = 4e-6, 1 / 5e9     # within a host
A_N, BETA_N = 30e-6, 1 / 1e9    # across hosts
GAMMA, OVER, CALL = 1 / 8e9, 2e-6, 50e-6
FABRIC = Fabric(proc=Link(1e-6, 1 / 10e9), host=Link(A_H, BETA_H), net=Link(A_N, BETA_N),
                gamma=GAMMA, overhead=OVER, call_overhead=CALL)


def close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(b), 1e-12)


# --- by hand -------------------------------------------------------------------------------

def test_two_rank_ring_by_hand():
    # round 0: each sends and receives B/2 and adds it; round 1: each sends and receives B/2.
    # Every round a participant posts one send and matches one receive: 2 messages.
    want = CALL + 2 * (A_H + 2 * OVER) + 2 * (B / 2) * BETA_H + (B / 2) * GAMMA
    p = predict(Collective.ALL_REDUCE, "ring", 2, B, FABRIC)
    assert close(p.seconds, want)
    assert close(p.reduction, B / 2 * GAMMA) and close(p.transfer, B * BETA_H)
    assert [count for _, count, _ in p.rounds] == [1, 1]


def test_two_rank_ring_in_one_process_uses_proc_links():
    p = predict(Collective.ALL_REDUCE, "ring", 2, B, FABRIC, Placement(2, None, processes=False))
    assert close(p.seconds, CALL + 2 * (1e-6 + 2 * OVER) + B / 10e9 + B / 2 * GAMMA)


def test_four_rank_rechd_by_hand():
    # halving: B/2 then B/4 exchanged and added; doubling: B/4 then B/2 exchanged
    want = CALL + 4 * (A_H + 2 * OVER) + 1.5 * B * BETA_H + 0.75 * B * GAMMA
    assert close(predict(Collective.ALL_REDUCE, "rechd", 4, B, FABRIC).seconds, want)


def test_four_rank_rechd_over_two_hosts_shares_each_hosts_link():
    # hosts {0, 1}, {2, 3}: distance 1 stays inside a host, distance 2 crosses, and both
    # ranks of a host cross at once: their B/4 (halving) and B/4 (doubling) add up on the link
    placement = Placement.nodes(2, 2)
    inside = 2 * (A_H + 2 * OVER) + (B / 2 + B / 2) * BETA_H
    across = 2 * (A_N + 2 * OVER) + (2 * B / 4 + 2 * B / 4) * BETA_N
    want = CALL + inside + across + 0.75 * B * GAMMA
    p = predict(Collective.ALL_REDUCE, "rechd", 4, B, FABRIC, placement)
    assert close(p.seconds, want)
    assert "host" in p.rounds[1][2].who and "link" in p.rounds[1][2].who
    unshared = predict(Collective.ALL_REDUCE, "rechd", 4, B,
                       Fabric(**{**FABRIC.__dict__, "nic_shared": False}), placement)
    assert close(p.seconds - unshared.seconds, 2 * (B / 4) * BETA_N)


def test_a_round_both_ways_pays_two_way_of_the_smaller_direction():
    """A link's ``two_way``: bytes moving the other way in the same round cost that fraction
    of beta (copies through one memory); a round that moves bytes one way pays nothing more,
    and the default (0: full duplex) prices every schedule as before."""
    both = Fabric(**{**FABRIC.__dict__, "host": Link(A_H, BETA_H, two_way=0.6)})
    # the 2-rank ring: each round sends and receives B/2, so 0.6 of B/2 more per round
    ring = predict(Collective.ALL_REDUCE, "ring", 2, B, both)
    assert close(ring.seconds, predict(Collective.ALL_REDUCE, "ring", 2, B, FABRIC).seconds +
                 2 * 0.6 * (B / 2) * BETA_H)
    # the tree and one_device: each round a participant sends or receives, never both
    for name, n in (("tree", 2), ("tree", 5), ("one_device", 4)):
        assert close(predict(Collective.ALL_REDUCE, name, n, B, both).seconds,
                     predict(Collective.ALL_REDUCE, name, n, B, FABRIC).seconds), name
    # across hosts: a host's ranks send B/2 and receive B/2 on its link together in each of
    # rechd's two crossing rounds (shared or not, the other way is priced alike)
    net = Link(A_N, BETA_N, two_way=0.5)
    for shared in (True, False):
        plain = Fabric(**{**FABRIC.__dict__, "nic_shared": shared})
        half = Fabric(**{**plain.__dict__, "net": net})
        extra = (predict(Collective.ALL_REDUCE, "rechd", 4, B, half, Placement.nodes(2, 2)).seconds
                 - predict(Collective.ALL_REDUCE, "rechd", 4, B, plain,
                           Placement.nodes(2, 2)).seconds)
        assert close(extra, 2 * 0.5 * (B / 2 if shared else B / 4) * BETA_N), shared
    # the defaults are full duplex, and say nothing of it
    assert Link(A_H, BETA_H) == Link(A_H, BETA_H, 0.0)
    assert all(Fabric().link(c).two_way == 0.0 for c in range(3))
    assert "other way" not in Fabric().describe()
    assert "the other way 0.60 of it" in both.describe()


def test_two_level_two_by_two_by_hand():
    # ring/ring over hosts {0, 1}, {2, 3}: inside, a reduce-scatter round (B/2 in, added);
    # across, the ring all-reduce of each member's half (B/4 each way per member, both
    # members of a host on its link: B/2), added in its first round; inside, an all-gather
    # round (B/2)
    placement = Placement.nodes(2, 2)
    inside = 2 * (A_H + 2 * OVER) + B * BETA_H
    across = 2 * (A_N + 2 * OVER) + 2 * (B / 2) * BETA_N
    want = CALL + inside + across + (B / 2 + B / 4) * GAMMA
    p = predict(Collective.ALL_REDUCE, "ring/ring", 4, B, FABRIC, placement,
                layout=placement.hosts)
    assert close(p.seconds, want)


def test_serial_fabric_adds_every_participant():
    serial = select.CostModel(latency=1e-6, shared_memory=True).as_fabric()
    one = predict(Collective.ALL_REDUCE, "one_device", 4, B, serial, Placement(4, None, False))
    # the root: 2 rounds, 3 + 3 messages; each other: 2 rounds, 1 + 1 message; 1 us each
    assert close(one.seconds, (2 + 6 + 3 * (2 + 2)) * 1e-6)


# --- the shortcuts give what pricing everyone gives ------------------------------------------

@pytest.mark.parametrize("name, collective", [
    ("ring", Collective.ALL_REDUCE), ("rechd", Collective.ALL_REDUCE),
    ("shuffle", Collective.ALL_REDUCE), ("ring", Collective.ALL_GATHER),
    ("rechd", Collective.ALL_GATHER), ("ring", Collective.REDUCE_SCATTER),
    ("tree", Collective.ALL_REDUCE), ("rechd", Collective.REDUCE_SCATTER),
    ("ring", Collective.BROADCAST), ("ring/ring", Collective.ALL_REDUCE),
    ("rechd/ring", Collective.ALL_REDUCE), ("shuffle/rechd", Collective.ALL_REDUCE)])
@pytest.mark.parametrize("n, per", [(64, 8), (96, 8), (80, 1)])
def test_symmetry_and_samples_agree_with_every_participant(name, collective, n, per):
    placement = Placement.nodes(n // per, per) if per > 1 else Placement(n)
    layout = placement.hosts if "/" in name else None
    if layout is None and "/" in name:
        layout = Placement.nodes(n // 8, 8).hosts
    kw = dict(layout=layout, root=5)
    # symmetric and periodic plans are exact; a pipeline's sampled middle is within 1%
    sampled = name in ("tree",) or collective is Collective.BROADCAST
    for nbytes in (4 << 10, 64 << 20):
        quick = predict(collective, name, n, nbytes, FABRIC, placement, **kw)
        every = predict(collective, name, n, nbytes, FABRIC, placement, exact=True, **kw)
        assert quick.seconds == pytest.approx(every.seconds, rel=0.01 if sampled else 1e-9)


# --- cheap at scale: counted, not timed --------------------------------------------------------

def _count_plans(monkeypatch) -> list:
    built = []
    real = algorithms._build

    def counted(*args):
        built.append(args[3])
        return real(*args)

    monkeypatch.setattr(algorithms, "_build", counted)
    return built


def test_simulating_65536_participants_builds_no_plan(monkeypatch, capsys):
    built = _count_plans(monkeypatch)
    algorithms.sampling._big_plan.cache_clear()
    assert cli.main(["simulate", "ring", "-n", "65536", "--nodes", "8192x8", "--link",
                     "host=3us:150GB/s,net=5us:400Gbit/s", "-b", "256M"]) == 0
    out = capsys.readouterr().out
    assert built == []  # no plan at all: closed forms over runs of equal rounds
    assert "rounds 0-65534" in out and "busbw" in out
    built.clear()
    assert cli.main(["simulate", "ring/ring", "-n", "65536", "--nodes", "8192x8"]) == 0
    assert built == []


def test_auto_for_2000_devices_is_cheap(monkeypatch):
    built = _count_plans(monkeypatch)
    select._decide.cache_clear()
    algorithms.sampling._small_plan.cache_clear()
    tracemalloc.start()
    name, _ = collectives.api.multi_device.pick_algorithm(
        Collective.ALL_REDUCE, "auto", 2000, 1 << 20, select.CostModel(shared_memory=True))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert name in select.CANDIDATES
    assert len(built) <= 3 * (algorithms.sampling.SPREAD + 20)  # a bounded sample, not 2,000
    assert peak < 200 << 20


def test_thread_ranks_that_ask_at_once_decide_once():
    """Sixteen thread ranks' first call of a size misses the cache at the same moment: one
    prices the candidates, the others wait for its decision instead of pricing them again."""
    select._decide.cache_clear()

    def first_call(comm):
        return comm.all_reduce(np.ones(12_345, np.float32))[0]

    assert collectives.run(first_call, 16) == [16.0] * 16
    assert select._decide.cache_info().misses == 1


# --- the choice ------------------------------------------------------------------------------

def test_measured_native_wins_where_it_is_faster():
    points = ((4 << 10, 10e-6), (1 << 20, 300e-6), (64 << 20, 80e-3))
    fabric = Fabric(host=Link(20e-6, 1 / 4e9), gamma=1 / 8e9, overhead=3e-6,
                    measured=(("native", "all_reduce", 2, points),))
    small = select.decide(Collective.ALL_REDUCE, 2, 4 << 10, fabric, natives=("native",),
                          payload=4 << 10)
    big = select.decide(Collective.ALL_REDUCE, 2, 64 << 20, fabric, natives=("native",),
                        payload=64 << 20)
    assert small.name == "native" and big.name in ("ring", "rechd")
    text = str(big)
    assert "native" in text and "measured" in text
    assert "rechd and ring are priced alike" in text  # (the schedules tie; native is dearer)
    assert interpolate(points, 1 << 20) == pytest.approx(300e-6)
    assert 10e-6 < interpolate(points, 64 << 10) < 300e-6


def test_native_without_measurements_is_modelled_at_native_overheads():
    p = predict_native("native", Collective.ALL_REDUCE, 8, 1 << 20, FABRIC)
    assert p.algorithm == "native" and "rechd" in p.note and p.seconds > 0
    assert predict_native("shm", Collective.ALL_REDUCE, 8, 1 << 20, FABRIC) is None


def test_across_hosts_auto_prefers_what_crosses_links_least():
    placement = Placement.nodes(8, 8)
    d = select.decide(Collective.ALL_REDUCE, 64, 256 << 20, FABRIC, placement)
    ring = next(p for p in d.predictions if p.label == "ring")
    assert d.best.seconds < ring.seconds  # the flat ring's 126 rounds cross hosts with 2(n-1)/n B
    assert any("/" in p.algorithm for p in d.predictions)


def test_fabric_round_trips_through_json():
    fabric = Fabric(gammas=(("float64", 1e-10),), measured=(("native", "all_reduce", 2,
                                                              ((4096, 1e-5),)),), raw=(("a", 1.0),))
    assert Fabric.from_json(fabric.to_json()) == fabric
    both = Fabric(host=Link(A_H, BETA_H, two_way=0.6))
    assert Fabric.from_json(both.to_json()) == both and both != Fabric(host=Link(A_H, BETA_H))
    # a file written before two_way: its links are full duplex
    old = json.loads(both.to_json())
    for name in ("proc", "host", "net"):
        del old[name]["two_way"]
    assert Fabric.from_json(json.dumps(old)).host == Link(A_H, BETA_H, 0.0)


# --- on a communicator -----------------------------------------------------------------------

def test_explain_lists_every_candidate_and_names_what_runs():
    def body(comm):
        x = np.ones(1 << 16, np.float32)
        comm.all_reduce(x)
        return comm.last_algorithm, comm.explain("all_reduce", x)

    for ran, decision in collectives.run(body, 4):
        assert decision.name == ran
        text = str(decision)
        for name in ("tree", "rechd", "ring", "shuffle", "one_device"):
            assert name in text
        assert "<- runs" in text and "wins by" in text


def test_calibration_on_thread_ranks_is_shared_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv(calibration.CACHE_ENV, str(tmp_path))

    def body(comm):
        first = calibration.apply(comm, True, repeats=2)
        again = calibration.apply(comm, "cached")
        return first, again, comm.fabric

    results = collectives.run(body, 2, timeout=300)
    first = results[0][0]
    assert all(r[0] == first and r[1] == first and r[2] == first for r in results)
    assert first.source.startswith("measured") and first.proc.beta > 0 and first.call_overhead > 0
    assert {k for k, _ in first.raw} >= {"call", "local.tree", "local.one", "local.big"}
    # threads share their buffers: no one-way stream, and no two-way term
    assert "local.oneway" not in dict(first.raw) and first.proc.two_way == 0.0
    files = list(tmp_path.glob("fabric-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["key"]["size"] == 2


@pytest.mark.parametrize("two_way", [0.0, 0.6])
@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_calibration_solves_the_constants_the_model_prices_its_probes_with(n, two_way):
    """The probes' times as the model predicts them on n ranks give back its constants (the
    measurement and the model agree at any group size) but for their few bytes' cost; on two
    ranks the charges are the pair's: tree = c + 2a + 2o, one = c + 2a + 4o, eight = c + 2a
    + 32o, big = one + S beta + S beta two_way + S/2 gamma, oneway = tree + 2 S beta + S
    gamma (no round both ways)."""
    link, over = Link(40e-6, 1 / 3e9, two_way), 7e-6
    fabric = Fabric(host=link, gamma=GAMMA, overhead=over, call_overhead=CALL)
    times = priced(calibration_links.probes(n), fabric, Placement(n))
    got, got_over = calibration_links.solve(times, CALL, GAMMA, n)
    near = lambda a, b: abs(a - b) <= 0.01 * b  # noqa: E731 (the few bytes' cost is neglected)
    assert near(got.alpha, link.alpha) and near(got.beta, link.beta) and near(got_over, over)
    assert got.two_way == pytest.approx(two_way, abs=0.01)
    if n == 2:
        k = calibration_links.coefficients(2)
        S = calibration_links.STREAM_BYTES
        assert [k[p][:2] for p in ("tree", "one", "eight", "big", "oneway")] == [
            (2, 2), (2, 4), (2, 32), (2, 4), (2, 2)]
        assert k["big"][2:4] == (S, S / 2) and k["big"].two_way == S
        assert k["oneway"][2:4] == (2 * S, S) and k["oneway"].two_way == 0


def test_two_way_falls_back_to_full_duplex_where_the_probes_cannot_tell():
    """Without the one-way probe (threads) or on a serial fabric, ``two_way`` stays 0 and
    beta is the ring's; a one-way stream slower than the ring's allows clips to 0, one so
    fast that the other way would cost more than beta clips to 1, beta the ring's at either."""
    fabric = Fabric(host=Link(40e-6, 1 / 3e9, two_way=0.6), gamma=GAMMA, overhead=7e-6,
                    call_overhead=CALL)
    times = probe_times(4, fabric)
    full = Fabric(host=Link(40e-6, 1 / 3e9 * 1.6), gamma=GAMMA, overhead=7e-6,
                  call_overhead=CALL)  # the ring's time from beta alone, as before two_way
    without = {k: v for k, v in times.items() if k != "oneway"}
    for got, _ in (calibration_links.solve(without, CALL, GAMMA, 4),
                   calibration_links.solve(times, CALL, GAMMA, 4, serial=True)):
        assert got.two_way == 0.0
    got, _ = calibration_links.solve(without, CALL, GAMMA, 4)
    assert got.beta == pytest.approx(full.host.beta, rel=0.01)
    for factor, clipped in ((3.0, 0.0), (0.2, 1.0)):
        odd = {**times, "oneway": times["oneway"] * factor}
        got, o = calibration_links.solve(odd, CALL, GAMMA, 4)
        assert got.two_way == clipped
        ring = Fabric(host=got, gamma=GAMMA, overhead=o, call_overhead=CALL)
        assert probe_times(4, ring)["big"] == pytest.approx(times["big"], rel=0.01)


def test_probe_command_prints_the_links(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(calibration.CACHE_ENV, str(tmp_path))
    out_json = tmp_path / "fabric.json"
    assert cli.main(["probe", "-n", "2", "-r", "2", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "proc" in out and "GB/s" in out and "cached in" in out
    assert Fabric.from_json(out_json.read_text()).source.startswith("measured")


def test_simulate_rejects_bad_links(capsys):
    with pytest.raises(SystemExit):
        cli.main(["simulate", "ring", "-n", "16", "--link", "wire=5us"])
    assert "CLASS=LATENCY:BANDWIDTH" in capsys.readouterr().err


# --- calibration that a bad moment cannot poison (a crowded host: test_crowding.py) -----------------------

def test_checks_agree_with_exact_probes_and_flag_a_poisoned_one():
    fabric = Fabric(host=Link(40e-6, 1 / 3e9), gamma=GAMMA, overhead=7e-6, call_overhead=CALL)
    times = probe_times(4, fabric)
    link, o = calibration_links.solve(times, CALL, GAMMA, 4)
    checks = calibration_links.check(times, link, o, CALL, GAMMA, 4)
    assert [c[0] for c in checks] == list(calibration_links.CHECKS)
    assert calibration_links.disagreement(checks) == pytest.approx(1.0, rel=0.02)
    # a burst during the streaming probe: the link looks 4x slower than the schedules move
    poisoned = {**times, "big": times["big"] * 4}
    link, o = calibration_links.solve(poisoned, CALL, GAMMA, 4)
    bad = calibration_links.check(poisoned, link, o, CALL, GAMMA, 4)
    assert calibration_links.disagreement(bad) > calibration_links.CONTRADICTED
    groups = {"local": ((0, 1, 2, 3),)}
    gammas = (("float32", GAMMA),)
    # probed again: the attempt the checks agree with counts, and nothing is flagged
    kept = calibration_measure.solved_fabric(Fabric(), CALL, gammas, {"local": [poisoned, times]}, (4, None),
                               (), fake_comm(4), groups)
    assert kept.host.beta == pytest.approx(fabric.host.beta, rel=0.02) and not kept.flags
    assert {c[1] for c in kept.checks} == set(calibration_links.CHECKS)
    # poisoned both times: kept, but flagged where a user looks
    flagged = calibration_measure.solved_fabric(Fabric(), CALL, gammas, {"local": [poisoned, poisoned]},
                                  (4, None), (), fake_comm(4), groups)
    assert flagged.flags and "large check" in flagged.flags[0] and "probed 2 times" in \
        flagged.flags[0]
    again = Fabric.from_json(flagged.to_json())
    assert again.flags == flagged.flags and again.checks == flagged.checks
    decision = select.decide(Collective.ALL_REDUCE, 4, B, flagged, Placement(4))
    assert "calibration flagged: local link" in str(decision)


def test_a_cache_that_cannot_be_written_is_a_warning_not_a_lost_measurement(tmp_path):
    # (a cache folder that is a file raised FileExistsError after the whole measurement)
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    fabric = Fabric(proc=Link(1.0, 1e-3), source="measured")
    with pytest.warns(RuntimeWarning, match=r"could not be cached in .*a-file .*COLLECTIVES_CACHE_DIR"):
        calibration.save(blocked / "fabric.json", {}, fabric)


def test_thread_ranks_take_their_cache_unchecked(tmp_path, monkeypatch):
    """Threads of one process share their buffers: schedules there move less than their
    messages say, so their calibration has no checks and a cache is taken as it is (under MPI
    the calibration scenario checks that a contradicted cache is measured again)."""
    monkeypatch.setenv(calibration.CACHE_ENV, str(tmp_path))
    slow = Fabric(proc=Link(1.0, 1e-3), host=Link(1.0, 1e-3), source="a busy moment")

    def body(comm):
        key = calibration.host_set(comm)
        if comm.rank == 0:
            calibration.save(calibration.cache_file(key), key, slow)
        comm.barrier()
        return calibration.apply(comm, True, repeats=2)

    assert all(got == slow for got in collectives.run(body, 2, timeout=300))


@pytest.mark.parametrize("field, value", [("gamma", "fast"), ("cores", -2),
                                          ("net", {"alpha": None, "beta": 1e-9}),
                                          ("gammas", [["float32", "x"]]), ("speed", 1.0),
                                          ("serial", "no"),
                                          ("measured", [["mpi", "all_reduce", 4, [["x", None]]]])])
def test_a_corrupt_cache_is_a_warning_naming_its_file_not_a_broken_auto(tmp_path, monkeypatch,
                                                                        field, value):
    # (a field of the wrong kind was read as it was: ``auto`` then raised a bare TypeError
    # at the communicator's next call)
    monkeypatch.setenv(calibration.CACHE_ENV, str(tmp_path))
    fields = json.loads(Fabric(source="measured").to_json())
    fields[field] = value

    def body(comm):
        key = calibration.host_set(comm)
        if comm.rank == 0:
            path = calibration.cache_file(key)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"key": key, "fabric": json.dumps(fields)}))
        comm.barrier()
        before = comm.fabric
        after = calibration.apply(comm, "cached")
        return before == after == comm.fabric, comm.all_reduce(np.arange(5.0)).tolist()

    with pytest.warns(RuntimeWarning, match=r"the cache .*fabric-.*\.json cannot be read"):
        results = collectives.run(body, 2)
    assert results == [(True, [0.0, 2.0, 4.0, 6.0, 8.0])] * 2
    with pytest.raises(ValueError, match=field.split("[")[0]):
        Fabric.from_json(json.dumps(fields))


def test_a_tie_is_said_to_be_one_not_a_win_by_nothing():
    # (two candidates priced alike read "tree wins by 0 ns (0%) over one_device")
    text = collectives.run(lambda c: str(c.explain("all_reduce", np.ones(1))), 2)[0]
    assert "wins by" not in text  # (tree and one_device tie here, on these constants)
    assert "tree and one_device are priced alike" in text, text

