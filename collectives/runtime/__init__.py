"""The runtime wing: how one call runs.

A call described and validated, agreed on by every rank, run as an operation by the engine
(stages, work handles, prepared calls, the fast path), the executors that run plans over
buffers, and the transport interface backends implement. It may import the base and
``collectives.algorithms``; backends and adapters build on it.
"""
