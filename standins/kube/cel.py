"""CEL for the admission policies (admission.py), with the cel-python package: imported on
first use only, so the demo and the agent never need it; errors worded as the real server
words them (kubernetes staging/src/k8s.io/apiserver/pkg/admission/plugin/cel/filter.go)."""

from __future__ import annotations

import threading
from typing import Any

from .errors import ApiError


class Cel:
    """cel-python, imported on first use; compiled programs are kept per expression."""

    def __init__(self) -> None:
        self._env: Any = None
        self._programs: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _celpy(self) -> Any:
        try:
            import celpy
        except ImportError:
            raise ApiError(
                500,
                "InternalError",
                "fakekube: evaluating a ValidatingAdmissionPolicy needs the cel-python package "
                "(pip install 'cel-python>=0.5')",
            ) from None
        return celpy

    def activation(self, values: dict[str, Any]) -> dict[str, Any]:
        celpy = self._celpy()
        return {name: celpy.json_to_cel(value) for name, value in values.items()}

    def _program(self, expression: str) -> Any:
        """The compiled program, or the compile error (an Exception) it gave."""
        with self._lock:
            if expression not in self._programs:
                celpy = self._celpy()
                if self._env is None:
                    self._env = celpy.Environment()
                try:
                    program: Any = self._env.program(self._env.compile(expression))
                except Exception as err:  # celpy raises its own parse/compile errors
                    program = err
                self._programs[expression] = program
            return self._programs[expression]

    def evaluate_raw(self, expression: str, activation: dict[str, Any]) -> tuple[Any, str | None]:
        """(the CEL value, None) or (None, the error as the real server words it:
        "compilation error: ..." or "expression '...' resulted in error: ...")."""
        program = self._program(expression)
        if isinstance(program, Exception):
            return None, f"compilation error: {_text(program)}"
        celpy = self._celpy()
        try:
            value = program.evaluate(activation)
        except Exception as err:  # CELEvalError, or a celpy limitation
            return None, f"expression '{expression}' resulted in error: {_text(err)}"
        if isinstance(value, celpy.CELEvalError):
            return None, f"expression '{expression}' resulted in error: {_text(value)}"
        return value, None

    def evaluate(self, expression: str, activation: dict[str, Any]) -> tuple[Any, str | None]:
        """As `evaluate_raw`, with CEL bools and strings as Python's (other values as CEL's)."""
        value, error = self.evaluate_raw(expression, activation)
        celtypes = self._celpy().celtypes
        if isinstance(value, celtypes.BoolType):
            return bool(value), error
        if isinstance(value, celtypes.StringType):
            return str(value), error
        return value, error

    def map_of(self, values: dict[str, Any]) -> Any:
        """A CEL map of CEL values (the policy's `variables`)."""
        celtypes = self._celpy().celtypes
        return celtypes.MapType({celtypes.StringType(k): v for k, v in values.items()})


def _text(err: BaseException) -> str:
    first = err.args[0] if err.args else err
    return str(first).strip()
