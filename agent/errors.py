"""Error types shared by the pure core and the shell."""

from __future__ import annotations


class InputError(ValueError):
    """A document that cannot be parsed; names the source and the field at fault."""

    def __init__(self, message: str, *, source: str = "", field: str = "") -> None:
        self.message = message
        self.source = source
        self.field = field
        super().__init__(self.render())

    def render(self) -> str:
        where = ": ".join(part for part in (self.source, self.field) if part)
        return f"{where}: {self.message}" if where else self.message

    def located(self, source: str) -> InputError:
        """The same error, attributed to a file."""
        return InputError(self.message, source=source, field=self.field)


class HostError(RuntimeError):
    """A host side effect failed; `kind` lets status reporting give a distinct reason."""

    def __init__(self, message: str, *, kind: str = "other") -> None:
        self.kind = kind
        super().__init__(message)
