"""The trainer clients of the reward service, re-exported from the `quorum_clients` distribution (clients/ in this
repository; docs/trainers.md): `serve.clients.trl`, `serve.clients.verl`, `serve.clients.openrlhf` and
`serve.clients.http` are the same objects as `quorum_clients.*`, kept under these names for quorum's own code and
tests. A trainer's environment installs `quorum_clients` alone (`pip install ./clients`), without quorum.
"""
