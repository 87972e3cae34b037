"""RFC 2397 data URLs as Ignition uses them for file contents (plain, percent-encoded, base64)."""

from __future__ import annotations

import base64
import binascii
import zlib
from urllib.parse import unquote_to_bytes

from agent.errors import InputError

# A MachineConfig is at most a few MiB in etcd; gzip turns that into at most this much (the
# bench's 5,000-file config is 67 MiB): a "gzip bomb" is refused, not expanded into memory.
MAX_DECOMPRESSED = 256 * 1024 * 1024


def decode_data_url(url: str) -> bytes:
    """Decode `data:[<mediatype>][;base64],<data>`; raises InputError on anything else."""
    if not isinstance(url, str):
        raise InputError(f"expected a data URL string, got {type(url).__name__}")
    if not url.startswith("data:"):
        scheme = (url.split(":", 1)[0] if ":" in url else url)[:20]
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
    try:
        return unquote_to_bytes(payload)
    except UnicodeEncodeError:  # a lone surrogate: no bytes spell it
        raise InputError("malformed data URL: not valid Unicode") from None


def decompress(data: bytes, compression: str | None) -> bytes:
    """Apply Ignition's `compression`: none or gzip (as the MCD: anything else is an error)."""
    if not compression:
        return data
    if compression != "gzip":
        raise InputError(f"unsupported compression {compression!r}: only gzip is supported")
    return gunzip(data, "contents")


def gunzip(data: bytes, what: str = "data", limit: int = MAX_DECOMPRESSED) -> bytes:
    """gzip (one member or several) with a bound on what it expands to; InputError else."""
    out = bytearray()
    try:
        while True:
            stream = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            out += stream.decompress(data, limit - len(out) + 1)
            if len(out) > limit or stream.unconsumed_tail:
                raise InputError(f"gzip {what} expand beyond {limit >> 20} MiB")
            if not stream.eof:
                raise InputError(f"invalid gzip {what} (truncated)")
            data = stream.unused_data
            if not data.strip(b"\0"):
                return bytes(out)
    except zlib.error as exc:
        raise InputError(f"invalid gzip {what} ({exc})") from None
