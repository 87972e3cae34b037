"""API errors rendered as `Status` objects, worded like kube-apiserver's.

Clients (and our agent) branch on `code` and `reason`; tests may also match on `message`, so the
wording follows k8s.io/apimachinery/pkg/api/errors.
"""

from __future__ import annotations

from typing import Any, Protocol


class NamedResource(Protocol):
    """What an error's wording reads of a resource type (resources.ResourceType). A protocol,
    not an import: resources.py raises these errors, so it sits above this module."""

    @property
    def group(self) -> str: ...

    @property
    def plural(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def qualified(self) -> str: ...


def status_body(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure" if code >= 300 else "Success",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    if not reason:
        del body["reason"]
    return body


class ApiError(Exception):
    """Raised anywhere in the fake server; the HTTP layer turns it into a Status response."""

    def __init__(
        self, code: int, reason: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        return status_body(self.code, self.reason, self.message, self.details)

    # -- constructors mirroring apimachinery's errors.NewXxx --------------------------------

    @staticmethod
    def _details(rt: NamedResource, name: str | None, **extra: Any) -> dict[str, Any]:
        d: dict[str, Any] = {}
        if name:
            d["name"] = name
        if rt.group:
            d["group"] = rt.group
        d["kind"] = rt.plural
        d.update(extra)
        return d

    @classmethod
    def not_found(cls, rt: NamedResource, name: str) -> ApiError:
        return cls(404, "NotFound", f'{rt.qualified} "{name}" not found', cls._details(rt, name))

    @classmethod
    def not_found_resource(
        cls, message: str = "the server could not find the requested resource"
    ) -> ApiError:
        return cls(404, "NotFound", message, {})

    @classmethod
    def already_exists(cls, rt: NamedResource, name: str) -> ApiError:
        return cls(
            409, "AlreadyExists", f'{rt.qualified} "{name}" already exists', cls._details(rt, name)
        )

    @classmethod
    def conflict(cls, rt: NamedResource, name: str) -> ApiError:
        return cls(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {rt.qualified} "{name}": the object has been '
            "modified; please apply your changes to the latest version and try again",
            cls._details(rt, name),
        )

    @classmethod
    def bad_request(cls, message: str) -> ApiError:
        return cls(400, "BadRequest", message)

    @classmethod
    def invalid(cls, rt: NamedResource, name: str, message: str) -> ApiError:
        return cls(
            422,
            "Invalid",
            f'{rt.kind} "{name}" is invalid: {message}',
            cls._details(rt, name),
        )

    @classmethod
    def expired(cls, message: str) -> ApiError:
        # The real watch cache uses errors.NewResourceExpired: code 410, reason "Expired".
        return cls(410, "Expired", message)

    @classmethod
    def unsupported_media_type(cls, content_type: str, accepted: list[str]) -> ApiError:
        return cls(
            415,
            "UnsupportedMediaType",
            f"the body of the request was in an unknown format - accepted media types include: "
            f"{', '.join(accepted)}",
        )


UNAUTHORIZED = status_body(401, "Unauthorized", "Unauthorized")
