"""``collectives simulate`` at any participant count: the closed forms
(``collectives.algorithms.closed_form.price``) against the per-participant pricing
(``collectives.algorithms.sampling.predict``), and a billion participants answered."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from collectives import algorithms
from collectives.algorithms.closed_form import price
from collectives.algorithms.cost import Placement
from collectives.algorithms.sampling import predict
from collectives.algorithms.schedule import Collective
from collectives.tools import cli
from collectives.tools.simulate import CLUSTERS

SINGLE = ("ring", "rechd", "tree", "shuffle", "one_device")
TWO_LEVEL = ("ring/ring", "rechd/ring", "ring/rechd", "shuffle/ring", "tree/tree",
             "shuffle/shuffle", "one_device/tree")
QUICK = SINGLE + ("ring/ring", "rechd/ring", "shuffle/shuffle")  # the quick subset's names
GPU, CPU = CLUSTERS["gpu"][1], CLUSTERS["cpu"][1]
FABRICS = {"gpu": GPU, "serial": replace(CPU, serial=True), "nic per participant":
           replace(CPU, nic_shared=False), "crowded": replace(CPU, cores=2, crowding=1e-6,
                                                              crowding_message=2e-7)}


def cases(n: int, names=SINGLE + TWO_LEVEL):
    """Every algorithm with every collective it has: (name, collective, shards, root)."""
    for name in names:
        for collective in Collective:
            if algorithms.supports(collective, name):
                for shards, root in ((0, n // 3), (4, n - 1)):
                    yield name, collective, shards, root


def assert_equal_pricing(n: int, per: int, fabric, *, threads: bool = False, names=None,
                         shards_too: bool = True, nbytes: int = 3 << 20, skip=()) -> int:
    """The closed form equals the per-participant pricing for every case over ``n``
    participants on hosts of ``per`` (0: one host): each round's part exactly, the totals to
    the rounding of their sums. Returns how many cases were compared."""
    placement = Placement.nodes(n // per, per, not threads) if per else Placement(n, None,
                                                                               not threads)
    compared = 0
    group = per if per and n // per > 1 else (4 if n % 4 == 0 and n > 4 else 0)
    # the groups are the same for every case: one Layout (the hosts' own where they are the
    # groups), not one built per case (at 131,072 participants building one costs a second)
    groups = None
    if group:
        groups = (placement.hosts if group == per and placement.hosts is not None
                  else Placement.nodes(n // group, group).hosts)
    for name, collective, shards, root in cases(n, names or SINGLE + TWO_LEVEL):
        if shards and not shards_too or (name, collective) in skip:
            continue
        if "/" in name and not group:
            continue  # two-level names need groups, as simulate says
        uses = "/" in name or shards
        layout = groups if uses else None
        want = predict(collective, name, n, nbytes, fabric, placement, root=root, shards=shards,
                       layout=layout)
        got = price(collective, name, n, nbytes, fabric, per=per, processes=not threads,
                    root=root, shards=shards, group=group if layout is not None else 0)
        where = f"{name} {collective.value} n={n} per={per} shards={shards} root={root}"
        assert got.rounds == want.rounds, where
        for field in ("seconds", "latency", "transfer", "reduction"):
            assert math.isclose(getattr(got, field), getattr(want, field), rel_tol=1e-9,
                                abs_tol=1e-15), (where, field)
        compared += 1
    return compared


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 13, 33, 64])
def test_closed_forms_equal_the_plans_on_one_host(n):
    assert assert_equal_pricing(n, 0, GPU, names=QUICK) > 0


@pytest.mark.parametrize("n,per", [(12, 4), (40, 8), (37, 1)])
def test_closed_forms_equal_the_plans_across_hosts(n, per):
    assert assert_equal_pricing(n, per, GPU, names=QUICK) > 0


@pytest.mark.parametrize("fabric", sorted(FABRICS))
def test_closed_forms_equal_the_plans_on_every_kind_of_fabric(fabric):
    assert assert_equal_pricing(24, 4, FABRICS[fabric], threads=fabric == "serial",
                                names=QUICK) > 0


@pytest.mark.slow
@pytest.mark.parametrize("n,per", [(2, 0), (3, 0), (7, 0), (32, 0), (37, 0), (101, 0), (8, 4),
                                   (96, 8), (101, 1), (128, 4), (48, 8)])
def test_every_two_level_name_and_count_equal_the_plans(n, per):
    assert assert_equal_pricing(n, per, GPU) > 0


@pytest.mark.slow
@pytest.mark.parametrize("n,per", [(1024, 8), (4099, 0), (8192, 8), (131072, 8)])
def test_closed_forms_equal_the_plans_at_large_counts(n, per):
    names = SINGLE + TWO_LEVEL if n <= 8192 else ("ring", "rechd", "tree", "shuffle",
                                                  "one_device", "ring/ring", "rechd/ring")
    # from 1,024 the plans of rooted collectives and all-to-all (sampled plans of n rounds or
    # messages each, or n distinct rounds) take minutes a case (hours at 131,072): there the
    # all-reduce family only (at 131,072 the all-reduce), which the suite can price by plans;
    # shards are compared up to 128 participants (test_every_two_level_name_and_count_...)
    kept = ((Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER)
            if n <= 8192 else (Collective.ALL_REDUCE,))
    slow = {(name, c) for name in names for c in Collective if c not in kept}
    compared = assert_equal_pricing(n, per, GPU, names=names, shards_too=False, skip=slow)
    assert compared > 0


def test_a_billion_participants_are_priced(capsys):
    # every algorithm over 10**9 participants on hosts of 8: an answer, finite and positive
    n = 10 ** 9
    for name, collective, shards, root in cases(n, QUICK):
        if shards and name not in ("ring", "shuffle"):
            continue  # shards change only these plans
        p = price(collective, name, n, 64 << 20, GPU, per=8, root=root, shards=shards,
                  group=8 if "/" in name or shards else 0)
        assert math.isfinite(p.seconds) and p.seconds > 0, (name, collective)
        assert sum(count for _, count, _ in p.rounds) > 0
    assert cli.main(["simulate", "ring", "-n", str(n), "--nodes", f"{n // 8}x8",
                     "-b", "64M"]) == 0
    out = capsys.readouterr().out
    assert "rounds 0-999999998 (999999999x)" in out


def test_native_and_two_level_simulate_past_the_old_limit(capsys):
    n = 1 << 20
    assert cli.main(["simulate", "native", "-n", str(n), "--nodes", f"{n // 8}x8"]) == 0
    assert cli.main(["simulate", "rechd/ring", "-n", str(n), "--group-size", "16",
                     "-c", "reduce_scatter"]) == 0
    out = capsys.readouterr().out
    assert out.count(f"over {n}:") == 2


def test_auto_past_its_limit_names_the_fix(capsys):
    with pytest.raises(SystemExit):
        cli.main(["simulate", "auto", "-n", str((1 << 17) + 1)])
    err = capsys.readouterr().err
    assert "auto" in err and "131,072" in err and "name an algorithm" in err


def test_price_rejects_hosts_that_do_not_divide():
    with pytest.raises(ValueError, match="per=3"):
        price(Collective.ALL_REDUCE, "ring", 10, 1 << 20, GPU, per=3)


def test_one_participant_moves_nothing_and_says_so(capsys):
    # (it printed "algbw inf GB/s, busbw nan GB/s")
    assert cli.main(["simulate", "ring", "-n", "1", "-b", "1M"]) == 0
    out = capsys.readouterr().out
    assert "# 1 participant," in out and "over 1: 0 ns, nothing moves" in out, out
    assert "inf" not in out and "nan" not in out, out


def test_the_slowest_link_is_named_by_its_time_not_its_bytes(capsys):
    # (a ring round moves as many bytes over the host link as over the network; the first
    # class of the tie, host, was named, though the network takes 100 times longer)
    assert cli.main(["simulate", "ring", "-n", "16", "--nodes", "2x8", "--link",
                     "host=1us:450GB/s,net=100us:1GB/s", "-b", "1M"]) == 0
    out = capsys.readouterr().out
    assert "slowest: participant 0 (64 KiB over net)" in out and "over host" not in out, out


def test_constants_no_calibration_measured_are_said_to_be_defaults(tmp_path, capsys):
    # (probe printed the transport's defaults for the classes it never measured as if
    # measured, and simulate --fabric priced with them under "measured ...")
    from dataclasses import replace

    from collectives.algorithms.cost import Fabric

    fabric = replace(Fabric(), source="measured today (local, 2 ranks)", probed=("proc",))
    assert "host  alpha" in fabric.describe()
    lines = fabric.describe().splitlines()
    assert "not measured" not in lines[0] and all("not measured" in line for line in lines[1:3])
    path = tmp_path / "fabric.json"
    path.write_text(fabric.to_json())
    assert Fabric.from_json(path.read_text()).probed == ("proc",)
    assert cli.main(["simulate", "ring", "-n", "8", "--fabric", str(path)]) == 0
    assert "(host, net: the transport's defaults, not measured)" in capsys.readouterr().out
