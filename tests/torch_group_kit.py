"""Thread ranks of a process group, for the process-group tests: a real gloo group over a
``HashStore``, or the library's ``process_group(comm)``; PyTorch imported when first used."""

from __future__ import annotations

import threading

import collectives


def on_gloo(job, size=2) -> list:
    """``job(group, rank)`` on ``size`` thread ranks of a gloo group over a ``HashStore``."""
    import torch.distributed as dist

    store, results = dist.HashStore(), [None] * size

    def rank_fn(rank):
        group = gloo_group(store, rank, size)
        try:
            results[rank] = job(group, rank)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            results[rank] = exc

    threads = [threading.Thread(target=rank_fn, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def gloo_group(store, rank: int, size: int):
    """Rank ``rank``'s gloo process group of ``size`` over ``store`` (a ``HashStore`` the
    ranks' threads share), as ``init_process_group`` would make it."""
    import torch
    import torch.distributed as dist

    prefixed = dist.PrefixStore("gloo", store)
    group = dist.ProcessGroup(prefixed, rank, size)
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO,
                            dist.ProcessGroupGloo(prefixed, rank, size))
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    return group


def on_collectives(job, size=2, **kwargs) -> list:
    """``job(group, rank)`` on ``size`` thread ranks of the library's process group."""
    from collectives.adapters import torch_ddp

    return collectives.run(lambda comm: job(torch_ddp.process_group(comm), comm.rank), size,
                           **kwargs)
