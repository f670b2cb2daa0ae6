"""The functions tasks call, and the spec each name has while tasks hold it.

`functions` is the config's table by name; `base` is the spec of any other name F (the
config's base_url: F is called at base.url/F, or at /F on base's upstream), if there is
one.  `specs` keeps the spec of every name tasks hold now, made once when the first of
them came (a base URL's spec made per lookup took an eighth of the broker's CPU per
enqueue), or None for a name gone from the config: its tasks wait, not called, until it
comes back or they are cancelled.  `uses` counts the tasks holding each name.

Nothing here reads a task: the ledger (ledger.py) says when one takes a name (`use`) and when it is
forgotten (`unuse`, True when it was the name's last).  A new config (`configure`, SIGHUP)
remakes the spec of every name in use; `specs` and `uses` are the same dicts for the
component's life, so the store and the views may hold them.
"""
from __future__ import annotations

from .....protocol.schema.tasks import FUNCTION_NAME
from .spec import FunctionSpec


class Functions:
    __slots__ = ("functions", "base", "specs", "uses")

    def __init__(self, functions: dict[str, FunctionSpec],
                 base: FunctionSpec | None = None) -> None:
        self.functions = dict(functions)
        self.base = base
        self.specs: dict[str, FunctionSpec | None] = {}   # name -> its spec while tasks use it
        self.uses: dict[str, int] = {}                      # name -> tasks that hold it

    def function(self, name: str) -> FunctionSpec | None:
        """The function `name`: configured by name, or under the base URL (kept in `specs`
        while tasks use the name)."""
        spec = self.functions.get(name)
        if spec is None and self.base is not None:
            spec = self.specs.get(name) or self.made(name)
        return spec

    def made(self, name: str) -> FunctionSpec | None:
        """The spec the config gives `name` now (None: none)."""
        spec = self.functions.get(name)
        if spec is None and self.base is not None and FUNCTION_NAME.fullmatch(name):
            base = self.base
            spec = (base._replace(name=name, path=f"/{name}") if base.upstream
                    else base._replace(name=name, url=f"{base.url.rstrip('/')}/{name}"))
        return spec

    def configure(self, functions: dict[str, FunctionSpec], base: FunctionSpec | None) -> None:
        """A new config: every name in use takes its new spec, or None."""
        self.functions, self.base = dict(functions), base
        for name in self.specs:
            self.specs[name] = self.made(name)

    def use(self, name: str, spec: FunctionSpec | None) -> None:
        """A task holds `name` (a new one, or one a restart brought back)."""
        self.specs[name] = spec
        self.uses[name] = self.uses.get(name, 0) + 1

    def unuse(self, name: str) -> bool:
        """A task holding `name` is forgotten; True if it was the last (the name's spec
        is dropped: the caller read it first if it needs it)."""
        left = self.uses[name] - 1
        if left:
            self.uses[name] = left
            return False
        del self.uses[name], self.specs[name]
        return True

    def names(self) -> set[str]:
        """The configured names and those tasks use."""
        return {*self.functions, *self.specs}
