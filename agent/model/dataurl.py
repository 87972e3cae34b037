"""RFC 2397 data URLs as Ignition uses them for file contents (plain, percent-encoded, base64)."""

from __future__ import annotations

import base64
import binascii
import gzip
import zlib
from urllib.parse import unquote_to_bytes

from agent.errors import InputError


def decode_data_url(url: str) -> bytes:
    """Decode `data:[<mediatype>][;base64],<data>`; raises InputError on anything else."""
    if not url.startswith("data:"):
        scheme = url.split(":", 1)[0] if ":" in url else url[:20]
        raise InputError(f"unsupported source scheme {scheme!r}: only data URLs are accepted")
    header, sep, payload = url[5:].partition(",")
    if not sep:
        raise InputError("malformed data URL: missing ','")
    params = header.split(";")
    if params[-1].strip().lower() == "base64":
        try:
            # Percent-escapes are legal inside a base64 payload too.
            raw = unquote_to_bytes(payload) if "%" in payload else payload.encode("ascii")
            return base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError, UnicodeEncodeError) as exc:
            raise InputError(f"malformed data URL: invalid base64 ({exc})") from None
    return unquote_to_bytes(payload)


def decompress(data: bytes, compression: str | None) -> bytes:
    """Apply Ignition's `compression`: none or gzip (as the MCD: anything else is an error)."""
    if not compression:
        return data
    if compression != "gzip":
        raise InputError(f"unsupported compression {compression!r}: only gzip is supported")
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"invalid gzip contents ({exc})") from None
