"""The TensorFlow adapter's GPU kit without TensorFlow on a GPU: what it does to CuPy arrays
(waiting, staging through pinned memory, dividing, copying to aligned memory) on every
visible device, and how memory lent to TensorFlow is kept until TensorFlow's readers are
done. Needs TensorFlow (a CPU build is enough) and CuPy with a GPU, or a CuPy stand-in on a
CPU, which reports any of this work sent to a device other than its memory's. Skipped, with
the reason, otherwise."""

from __future__ import annotations

import gc
import importlib.util
import weakref

import numpy as np
import pytest
from gpukit import STAND_IN, gpu_count, gpu_reason, host, on_devices


def _reason() -> str | None:
    if importlib.util.find_spec("tensorflow") is None:
        return "TensorFlow is not installed (pip install -e '.[tensorflow]')"
    return gpu_reason()


REASON = _reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def test_the_kit_works_on_each_arrays_own_device():
    """From a thread on device 0, every step runs on the array's device (finish waits on
    each GPU's own current stream: a null stream handle means the current device's)."""
    import cupy
    from collectives.adapters.tensorflow import kits

    n = gpu_count()
    values = [np.full(1000, float(d + 1), np.float32) for d in range(n)]
    arrays = on_devices(values, list(range(n)))
    with cupy.cuda.Device(0):
        kits.CUPY.finish(arrays)
        hosts = kits.CUPY.stage(arrays, kits.PinnedBuffer())
        assert [float(h[0]) for h in hosts] == [d + 1.0 for d in range(n)]
        for h, a in zip(hosts, arrays):
            kits.CUPY.unstage(h * 2, a)
            kits.CUPY.divide(a, 4)
            aligned = kits.CUPY.aligned(a[1:])  # an unaligned view: a copy on a's device
            assert aligned.device.id == a.device.id
            assert STAND_IN or aligned.data.ptr % 64 == 0  # (the stand-in's memory is NumPy's)
            assert (host(aligned) == host(a)[1:]).all()
        kits.CUPY.finish(arrays)
    assert [float(host(a)[-1]) for a in arrays] == [(d + 1) / 2 for d in range(n)]
    assert [a.device.id for a in arrays] == list(range(n))


def test_memory_lent_to_tensorflow_is_freed_only_after_a_sync():
    """TensorFlow frees a tensor once its readers are enqueued, not run: the array behind a
    lent view outlives the view until release_retired (what sync_tensorflow calls after
    TensorFlow's SyncDevice)."""
    from collectives.adapters.tensorflow import dlpack

    device = gpu_count() - 1
    (array,) = on_devices([np.arange(8, dtype=np.float32)], [device])
    view = dlpack.lend(array)
    assert view.data.ptr == array.data.ptr and view.device.id == device
    assert (host(view) == np.arange(8)).all()
    alive = weakref.ref(array)
    mark = dlpack.retired_since(device)
    del array
    gc.collect()
    assert alive() is not None  # the view holds it
    del view
    gc.collect()
    assert alive() is not None and dlpack.retired_since(device) == mark + 1  # retired
    dlpack.release_retired(device, mark)  # a sync that began before it was retired
    assert alive() is not None
    dlpack.release_retired(device, mark + 1)
    gc.collect()
    assert alive() is None
