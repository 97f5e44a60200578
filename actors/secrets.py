"""Secret environment variables (API keys, the Serve token) handed to Ray actors without Ray writing them down.

Workers of a cluster this process started inherit its environment; workers of an already running cluster never
saw what this process exported. The values must reach them, but not through a runtime env: Ray's runtime-env
agent logs every runtime env it sets up, `env_vars` included, in clear text (`runtime_env_agent.log`, mode 644).
A `Secrets` object travels instead as an actor constructor argument (pickled into the actor's creation task,
held in memory, never logged) and the actor installs the values into its own environment before it reads them.
Configs, manifests and logs only ever hold variable names; `repr` shows names only.

    secrets = Secrets(["JUDGE_KEY"])          # on the driver: the values set here
    ds.map_batches(Worker, fn_constructor_kwargs={"secrets": secrets, ...})
    secrets.install()                         # in the actor's constructor
"""

from __future__ import annotations

import os
from collections.abc import Iterable


class Secrets:
    """Values of the named environment variables that are set (and non-empty) in this process."""

    def __init__(self, names: Iterable[str] = ()):
        self._values = {name: os.environ[name] for name in sorted(set(names)) if name and os.environ.get(name)}

    @property
    def names(self) -> list[str]:
        return list(self._values)

    def install(self) -> None:
        """Set the values in this process's environment (an actor's), where engines read them by name."""
        os.environ.update(self._values)

    def __bool__(self) -> bool:
        return bool(self._values)

    def __repr__(self) -> str:
        return f"Secrets(names={self.names})"

    __str__ = __repr__
