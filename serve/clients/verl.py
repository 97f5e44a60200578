"""`quorum_clients.verl` (clients/quorum_clients/verl.py) under quorum's name: this module is replaced by that one,
so `serve.clients.verl is quorum_clients.verl` (one copy of the code, one state)."""

import sys

import quorum_clients.verl as _module

sys.modules[__name__] = _module
