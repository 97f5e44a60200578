"""`quorum_clients.trl` (clients/quorum_clients/trl.py) under quorum's name: this module is replaced by that one,
so `serve.clients.trl is quorum_clients.trl` (one copy of the code, one state)."""

import sys

import quorum_clients.trl as _module

sys.modules[__name__] = _module
