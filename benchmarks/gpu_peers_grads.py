"""ResNet-50's 161 gradients (their real shapes, 25.6 M float32) on one GPU, each way doing
the same work (``gpu_peers.py`` runs it as the ``resnet50`` part).

The library's ``batch_all_reduce`` packs the list into buckets, all-reduces them and returns
the results as views of the reduced buckets; where the last step's results are gone, it packs
into the same buckets and hands back the same views (``collectives/algorithms/reuse.py``).
``library_*_kept`` holds each step's results for two steps more (the keeper's two
generations), so nothing is reused (every bucket and view made anew, as torch's reference
makes them). Beside it:

* ``torch_flat_views``: torch with the same semantics: ``_flatten_dense_tensors``, one
  ``dist.all_reduce``, ``_unflatten_dense_tensors`` (views);
* copying back into the gradients, on both sides: ``torch_flat_copy_back`` (the above, then
  ``torch._foreach_copy_`` into the gradients) beside ``library_torch_copy_back`` (the
  library's call on the tensors, then the same ``_foreach_copy_``); CuPy, which has no
  ``_foreach`` copy, copies each result into its array (``library_cupy_copy_back``), beside
  torch doing the same (``torch_flat_copy_each``: one ``copy_`` per gradient);
* ``torch_coalesced``: ``dist.all_reduce_coalesced`` where it exists (NCCL: one
  ``ncclAllReduce`` per tensor inside one group, no flatten), in place, and
  ``torch_per_tensor``: one ``dist.all_reduce`` per tensor, in place: both leave the results
  in the gradients, so the library's side is ``library_torch_copy_back``;
* ``ddp_backward`` beside ``plain_backward``: a module whose parameters have these shapes,
  its backward pass with and without DDP's own reducer (world size 1: it still buckets,
  all-reduces, divides by the world size and copies back); the difference is what the
  reducer costs a step. ``library_backward`` does the reducer's work after the plain
  backward pass: the library's mean of the gradients, copied back with ``_foreach_copy_``.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

from gpu_compare import Record
from gpu_peers import fence_for, library, measure, resnet50_shapes, torch_dist


def _torch_ways(torch, dist, comm, shapes) -> dict:
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    grads = [torch.full(s, 0.5, device="cuda:0") for s in shapes]
    got = comm.batch_all_reduce(grads)
    assert isinstance(got[0], torch.Tensor) and tuple(got[-1].shape) == shapes[-1]

    def flat_views():
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        return _unflatten_dense_tensors(flat, grads)

    def flat_copy_back():
        torch._foreach_copy_(grads, flat_views())

    def flat_copy_each():
        for g, r in zip(grads, flat_views()):
            g.copy_(r)

    def library_copy_back():
        torch._foreach_copy_(grads, comm.batch_all_reduce(grads))

    held: list = []

    def library_kept():  # each step's results held two steps more: no bucket reused
        held[:] = [*held[-1:], comm.batch_all_reduce(grads)]  # (kept buckets: the last two steps')

    ways = {"library_torch": lambda: comm.batch_all_reduce(grads),
            "library_torch_kept": library_kept,
            "torch_flat_views": flat_views,
            "library_torch_copy_back": library_copy_back,
            "torch_flat_copy_back": flat_copy_back,
            "torch_flat_copy_each": flat_copy_each,
            "torch_per_tensor": lambda: [dist.all_reduce(g) for g in grads]}
    if hasattr(dist, "all_reduce_coalesced"):
        # (deprecated in favour of the above: its FutureWarning silenced once, not per call)
        warnings.filterwarnings("ignore", message=".*all_reduce_coalesced",
                                category=FutureWarning)
        ways["torch_coalesced"] = lambda: dist.all_reduce_coalesced(grads)
    return ways


def _ddp_ways(torch, comm, shapes) -> dict:
    """A backward pass over parameters of these shapes: plain, under DDP, and plain followed
    by the library's mean of the gradients, copied back."""
    from torch.nn.parallel import DistributedDataParallel

    class Grads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.params = torch.nn.ParameterList(
                [torch.nn.Parameter(torch.full(s, 0.5)) for s in shapes])

        def forward(self, scale):
            # every gradient is ``scale`` (one cheap elementwise kernel per parameter)
            return sum((p * scale).sum() for p in self.params)

    plain = Grads().cuda()
    ddp = DistributedDataParallel(Grads().cuda())
    scale = torch.ones((), device="cuda:0")

    def step(model):
        model.zero_grad(set_to_none=False)
        model(scale).backward()

    def library_step():
        step(plain)
        grads = [p.grad for p in plain.parameters()]
        torch._foreach_copy_(grads, comm.batch_all_reduce(grads, "mean"))

    return {"plain_backward": lambda: step(plain), "ddp_backward": lambda: step(ddp),
            "library_backward": library_step}


def resnet50_part(out: Path, args) -> None:
    import cupy

    comm = library()
    peers, why = torch_dist()
    fence = fence_for(peers)
    shapes = resnet50_shapes()[:args.tensors]
    count = sum(math.prod(s) for s in shapes)
    record = Record(out, "resnet50", tensors=len(shapes), floats=count, repeats=args.repeats,
                    torch=why or peers[0].__version__)
    grads = [cupy.full(s, 0.5, cupy.float32) for s in shapes]
    results = comm.batch_all_reduce(grads)
    assert all(r.shape == g.shape for r, g in zip(results, grads))
    assert float(results[-1].ravel()[-1]) == 0.5

    def cupy_copy_back():
        for g, r in zip(grads, comm.batch_all_reduce(grads)):
            cupy.copyto(g, r)

    held: list = []

    def cupy_kept():  # each step's results held two steps more: no bucket reused
        held[:] = [*held[-1:], comm.batch_all_reduce(grads)]  # (kept buckets: the last two steps')

    ways: dict = {"library_cupy": lambda: comm.batch_all_reduce(grads),
                  "library_cupy_kept": cupy_kept,
                  "library_cupy_copy_back": cupy_copy_back,
                  "library_cupy_async": lambda: comm.batch_all_reduce(grads,
                                                                      async_op=True).wait()}
    if peers is not None:
        torch, dist = peers
        ways.update(_torch_ways(torch, dist, comm, shapes))
    calls = max(args.calls // 4, 1)
    ratios = [("library_torch", "torch_flat_views"), ("library_cupy", "torch_flat_views"),
              ("library_torch_kept", "torch_flat_views"), ("library_cupy_kept", "torch_flat_views"),
              ("library_torch_copy_back", "torch_flat_copy_back"),
              ("library_cupy_copy_back", "torch_flat_copy_each"),
              ("library_torch_copy_back", "torch_coalesced"),
              ("library_torch_copy_back", "torch_per_tensor")]
    steps = type(args)(**{**vars(args), "calls": calls})
    measure(record, {"kind": "gradient list, one step"}, ways, fence, steps, ratios)
    if peers is not None:
        torch = peers[0]
        measure(record, {"kind": "backward pass, with and without DDP's reducer"},
                _ddp_ways(torch, comm, shapes), fence, steps,
                [("ddp_backward", "plain_backward"), ("library_backward", "ddp_backward")])
    fence()
