"""The API wing: what users call.

The multi-device functions (one process holds one array per device), the SPMD
:class:`~collectives.api.communicator.Communicator` with its families of methods, and
``init``. It may import the base (``collectives.errors``, ``ops``, ``arrays``, ``foreign``,
``log``, ``registry``), :mod:`collectives.algorithms` and :mod:`collectives.runtime`; users
import its names from :mod:`collectives` itself.
"""
