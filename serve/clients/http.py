"""`quorum_clients.http` (clients/quorum_clients/http.py) under quorum's name: this module is replaced by that one,
so `serve.clients.http is quorum_clients.http` (one copy of the code, one state)."""

import sys

import quorum_clients.http as _module

sys.modules[__name__] = _module
