"""Another library's arrays, here a toy class of its own (``toy_arrays``, one file): every
collective takes them and gives them back as that type, and a batch of them is packed on
their side (a registered array kind), so only the buckets cross into the library."""

from __future__ import annotations

import numpy as np
import pytest
from toy_arrays import KIND, ToyArray

import collectives
from collectives.foreign import register_array_kind
from collectives.tools.reference import exact_inputs, expected_outputs, reference

register_array_kind(KIND)


def toy(values):
    return [ToyArray(v) for v in values]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_every_collective_takes_and_gives_toy_arrays(n):
    xs = exact_inputs(n, 12, np.float32, "sum")
    rows = [x.reshape(12, 1) for x in xs]

    def body(comm):
        r = comm.rank
        return {
            "all_reduce": comm.all_reduce(ToyArray(xs[r])),
            "reduce": comm.reduce(ToyArray(xs[r]), "sum", root=0),
            "broadcast": comm.broadcast(ToyArray(xs[0]) if r == 0 else None, 0),
            "all_gather": comm.all_gather(ToyArray(xs[r])),
            "reduce_scatter": comm.reduce_scatter(ToyArray(rows[r])),
        }

    got = collectives.run(body, n)
    for r, results in enumerate(got):
        want = {"all_reduce": reference(xs, "sum"), "broadcast": xs[0],
                "all_gather": np.concatenate(xs),
                "reduce_scatter": expected_outputs("reduce_scatter", rows, "sum")[r]}
        if r == 0:
            want["reduce"] = reference(xs, "sum")
        for name, value in want.items():
            # (a broadcast's non-roots pass None: nothing says what type they want)
            if name != "broadcast" or r == 0:
                assert isinstance(results[name], ToyArray), (name, type(results[name]))
            results[name] = getattr(results[name], "data", results[name])
            assert np.array_equal(results[name], value), name
    multi = collectives.all_reduce(toy(xs), "sum")
    assert all(isinstance(m, ToyArray) and np.array_equal(m.data, reference(xs, "sum"))
               for m in multi)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_batch_of_toy_arrays_is_packed_on_their_side(n):
    shapes = [(3, 2), (7,), (0,), (5,)]
    lists = [exact_inputs(n, int(np.prod(s)), np.float64, "sum", seed=k, shape=s)
             for k, s in enumerate(shapes)]
    before = KIND.concatenated
    got = collectives.run(lambda comm: comm.batch_all_reduce(
        [ToyArray(v[comm.rank]) for v in lists]), n)
    assert KIND.concatenated - before == n  # one bucket per rank, concatenated on the toy side
    for results in got:
        for k, result in enumerate(results):
            assert isinstance(result, ToyArray) and result.shape == shapes[k]
            assert np.array_equal(result.data, reference(lists[k], "sum"))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_buckets_of_toy_arrays_are_packed_on_their_side(n):
    shapes = [(4,), (3, 3), (5,), (2,)]
    lists = [exact_inputs(n, int(np.prod(s)), np.float32, "sum", seed=k, shape=s)
             for k, s in enumerate(shapes)]

    def body(comm):
        buckets = comm.buckets([ToyArray(v[comm.rank]) for v in lists], bucket_bytes=48)
        got = []
        for _ in range(2):  # two steps, tensors marked ready last to first
            for k in reversed(range(len(shapes))):
                buckets.ready(k, ToyArray(lists[k][comm.rank]))
            got.append(buckets.wait())
        return got

    before = KIND.concatenated
    for steps in collectives.run(body, n):
        for results in steps:
            for k, result in enumerate(results):
                assert isinstance(result, ToyArray) and result.shape == shapes[k]
                assert np.array_equal(result.data, reference(lists[k], "sum"))
    assert KIND.concatenated > before  # (a bucket of several tensors: packed by the toy kind)


def test_the_core_routes_arrays_by_their_owners_not_by_module_names():
    """Which backend takes an array is the backends' to say (``collectives.device_arrays``
    entry points, ``registry.owner_of``): the core compares no module name with a library's."""
    import pathlib
    import re

    from collectives import registry

    names = dict(registry.device_array_owners())
    assert "cupy" in names and not names["cupy"](np.zeros(3))  # (without importing CuPy)
    assert registry.owner_of(np.zeros(3)) is None and registry.owner_of([1.0]) is None
    core = pathlib.Path(collectives.__file__).parent
    compare = re.compile(r"""(__module__[^\n]*|kinds?\[\d\]\s*)[=!]=\s*["'](\w+)["']""")
    found = [f"{p.relative_to(core)}: {m.group(0)}" for p in core.rglob("*.py")
             for m in compare.finditer(p.read_text())]
    assert not found, found


class _DetectsOnly:
    @staticmethod
    def detect(x: object) -> bool:
        return False


class _PacksHalfway(_DetectsOnly):
    def concatenate(self, arrays, axis):  # (packing without the rest of it)
        return arrays


def _with(**attributes):
    kind = _DetectsOnly()
    kind.__dict__.update(attributes)
    return kind


@pytest.mark.parametrize("bad, says", [
    (object(), "has no method detect(x)"),
    (None, "has no method detect(x)"),
    (type(KIND), "is the class ToyKind, not an array kind; pass an instance (ToyKind())"),
    (_with(detect=True), "has no method detect(x)"),
    (_PacksHalfway(), "packs batches (concatenate) but lacks owns, dtype_of"),
    (_with(back="numpy"), "kind.back is a str, not a method"),
    (_with(out_refusal=True), "kind.out_refusal is a bool, not a str"),
])
def test_register_array_kind_refuses_what_is_not_one(bad, says):
    with pytest.raises(TypeError, match="kind") as raised:
        register_array_kind(bad)
    message = str(raised.value)
    assert says in message, message
    assert "an array kind is an object with a method detect(x)" in message  # what one provides
    # nothing was registered: toy arrays still cross as before
    got = collectives.run(lambda comm: comm.all_reduce(ToyArray(np.arange(3.0))), 2)
    assert all(isinstance(g, ToyArray) and np.array_equal(g.data, [0.0, 2.0, 4.0]) for g in got)


class _Holder:
    """An array held inside, crossing through DLPack."""

    def __init__(self, data):
        self.data = np.asarray(data)
        self.shape, self.dtype = self.data.shape, self.data.dtype

    def __dlpack__(self, *args, **kwargs):
        return self.data.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.data.__dlpack_device__()


class _Wrapped(_Holder):
    """Arrays whose module has no ``from_dlpack``: only their kind's ``back`` makes one."""


class _WrappedKind(_DetectsOnly):
    @staticmethod
    def detect(x: object) -> bool:
        return isinstance(x, _Wrapped)

    @staticmethod
    def back(result, like):
        return _Wrapped(result)


def test_register_array_kind_takes_a_kind_that_does_not_pack():
    register_array_kind(_WrappedKind())  # detect and back: its arrays cross one by one
    got = collectives.run(lambda comm: comm.batch_all_reduce(
        [_Wrapped(np.arange(3.0)), _Wrapped(np.ones(2))]), 2)
    for results in got:
        assert all(isinstance(r, _Wrapped) for r in results), results
        assert np.array_equal(results[0].data, [0.0, 2.0, 4.0])
        assert np.array_equal(results[1].data, [2.0, 2.0])


class _Viewed(_Holder):
    """Arrays whose kind crosses them its own way (as_numpy, back, on_gpu) but takes no out=
    (not a ``_Wrapped``: its kind, registered earlier, would claim them first)."""


class _ViewedKind(_DetectsOnly):
    out_refusal = "these arrays are immutable"

    @staticmethod
    def detect(x: object) -> bool:
        return isinstance(x, _Viewed)

    @staticmethod
    def as_numpy(x):
        return x.data

    @staticmethod
    def on_gpu(x) -> bool:
        return False

    @staticmethod
    def back(result, like):
        return _Viewed(result)


def test_a_kind_that_crosses_its_own_way_still_refuses_an_out():
    """The short way across (``host_view``) keeps the edge's refusal of an ``out=`` its kind
    cannot fill: the error names ``out`` and the kind's reason."""
    register_array_kind(_ViewedKind())

    def body(comm):
        got = comm.all_reduce(_Viewed(np.arange(3.0)))
        with pytest.raises(TypeError, match="out.*immutable"):
            comm.all_reduce(_Viewed(np.arange(3.0)), out=_Viewed(np.zeros(3)))
        return got

    for got in collectives.run(body, 1):
        assert isinstance(got, _Viewed) and np.array_equal(got.data, [0.0, 1.0, 2.0])


class _CopyingOut:
    """An ``out=`` whose ``__array__`` hands over a copy each time (as a TensorFlow variable's)."""

    def __init__(self, n: int):
        self.values = np.zeros(n, np.float32)

    def __array__(self, dtype=None, copy=None):
        return self.values.copy()


def test_an_out_that_can_only_be_read_as_a_copy_is_refused_on_every_rank():
    # (filled, the copy was dropped: out kept its old values, and the call returned it)
    def body(comm):
        out = _CopyingOut(3) if comm.rank == 0 else None
        try:
            comm.all_reduce(np.ones(3, np.float32), out=out)
            outcome = "returned"
        except collectives.CollectiveError as exc:
            outcome = type(exc).__name__
        except TypeError as exc:
            outcome = "refused" if "cannot be filled in place" in str(exc) else str(exc)
        return outcome, comm.all_reduce(np.ones(2)).tolist()

    assert collectives.run(body, 2, timeout=10) == [("refused", [2.0, 2.0]),
                                                    ("PeerFailedError", [2.0, 2.0])]
    with pytest.raises(TypeError, match=r"out\[0\] \(_CopyingOut\) cannot be filled in place"):
        collectives.all_reduce([np.ones(3, np.float32)] * 2, out=[_CopyingOut(3), _CopyingOut(3)])
