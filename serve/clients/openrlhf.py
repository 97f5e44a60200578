"""`quorum_clients.openrlhf` (clients/quorum_clients/openrlhf.py) under quorum's name: this module is replaced by that one,
so `serve.clients.openrlhf is quorum_clients.openrlhf` (one copy of the code, one state)."""

import sys

import quorum_clients.openrlhf as _module

sys.modules[__name__] = _module
