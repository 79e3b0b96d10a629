"""The API wing: what users call.

The multi-device functions (one process holds one array per device), the SPMD
``Communicator`` with its families of methods, and
``init``. It may import the base (``collectives.errors``, ``ops``, ``arrays``, ``foreign``,
``log``, ``registry``), ``collectives.algorithms`` and ``collectives.runtime``; users
import its names from ``collectives`` itself.
"""
