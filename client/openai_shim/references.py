"""Reference audio sources -> bytes, under the shim's security rules.

  data:<media type>;base64,<data>   always allowed (it is part of the request body)
  http(s)://...                     only with --allow-url-references; no redirects; size and time
                                    limits; hosts that resolve to loopback/private/link-local
                                    addresses only with --allow-private-url-hosts
  a path, or file:///path           only with --reference-dir, and only inside it after resolving
                                    `..` and symlinks
The bytes are not decoded here: the server's ref_encoder decodes them (bad audio -> 400).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx

from .config import ShimConfig
from .errors import ApiError, bad_request, too_large

DOWNLOAD_CHUNK_BYTES = 1 << 16


async def load_reference(param: str, source: str, config: ShimConfig) -> bytes:
    """The audio bytes `source` names; `param` is the JSON field, for error messages."""
    source = source.strip()
    scheme = source.split(":", 1)[0].lower() if ":" in source else ""
    if scheme == "data":
        return _decode_data_uri(param, source, config.max_reference_bytes)
    if scheme in ("http", "https"):
        return await _download(param, source, config)
    if scheme == "file":
        return await _read_local(param, unquote(urlsplit(source).path), config)
    if "://" in source:
        raise bad_request(f"{param}: unsupported scheme {scheme!r}; use a data: URI, an http(s) URL or a path",
                          param)
    return await _read_local(param, source, config)


def _decode_data_uri(param: str, uri: str, limit: int) -> bytes:
    header, sep, payload = uri.partition(",")
    if not sep or not header.lower().endswith(";base64"):
        raise bad_request(f"{param}: a data URI must look like data:audio/wav;base64,<data>", param)
    if len(payload) * 3 // 4 > limit + 3:
        raise _reference_too_large(param, limit)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{param}: the data URI is not valid base64", param) from None
    if len(data) > limit:
        raise _reference_too_large(param, limit)
    if not data:
        raise bad_request(f"{param}: the data URI holds no audio", param)
    return data


def _reference_too_large(param: str, limit: int) -> ApiError:
    return too_large(f"{param}: the reference audio is larger than {limit} bytes (--max-reference-bytes)", param,
                     code="reference_too_large")


async def _read_local(param: str, path: str, config: ShimConfig) -> bytes:
    base = config.reference_dir
    if base is None:
        raise bad_request(f"{param}: local paths are off on this server (start the shim with --reference-dir); "
                          f"send the audio as a data: URI instead", param)
    try:
        candidate = Path(path)
        resolved = (candidate if candidate.is_absolute() else base / candidate).resolve()
        # resolve() followed every symlink and `..`, so this also stops symlinks that point outside.
        if not resolved.is_relative_to(base):
            raise bad_request(f"{param}: {path!r} is outside the reference directory", param)
        if not resolved.is_file():
            raise bad_request(f"{param}: {path!r} is not a file in the reference directory", param)
        if resolved.stat().st_size > config.max_reference_bytes:
            raise _reference_too_large(param, config.max_reference_bytes)
        return await asyncio.to_thread(resolved.read_bytes)
    except (OSError, ValueError) as exc:  # unreadable, embedded NUL, ...
        raise bad_request(f"{param}: cannot read {path!r}: {type(exc).__name__}", param) from None


async def _download(param: str, url: str, config: ShimConfig) -> bytes:
    if not config.allow_url_references:
        raise bad_request(f"{param}: URL references are off on this server (start the shim with "
                          f"--allow-url-references); send the audio as a data: URI instead", param)
    try:
        async with asyncio.timeout(config.url_timeout_s):
            if not config.allow_private_url_hosts:
                await _require_public_host(param, url)
            return await _fetch(param, url, config.max_reference_bytes)
    except TimeoutError:
        raise bad_request(f"{param}: the URL was not downloaded within {config.url_timeout_s:g} s", param) from None
    except httpx.HTTPError as exc:
        raise bad_request(f"{param}: could not fetch the URL: {type(exc).__name__}", param) from None


async def _require_public_host(param: str, url: str) -> None:
    parts = urlsplit(url)
    if not parts.hostname:
        raise bad_request(f"{param}: the URL has no host", param)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(parts.hostname, parts.port or 443)
    except OSError:
        raise bad_request(f"{param}: cannot resolve {parts.hostname!r}", param) from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%", 1)[0])
        if not address.is_global:
            raise bad_request(f"{param}: {parts.hostname!r} is a loopback/private/link-local address; this server "
                              f"fetches only public hosts (--allow-private-url-hosts)", param)


async def _fetch(param: str, url: str, limit: int) -> bytes:
    async with httpx.AsyncClient(follow_redirects=False) as client:
        async with client.stream("GET", url) as response:
            if response.status_code != 200:
                hint = " (redirects are not followed)" if response.is_redirect else ""
                raise bad_request(f"{param}: the URL answered HTTP {response.status_code}{hint}", param)
            declared = response.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise _reference_too_large(param, limit)
            chunks, size = [], 0
            async for chunk in response.aiter_bytes(DOWNLOAD_CHUNK_BYTES):
                size += len(chunk)
                if size > limit:
                    raise _reference_too_large(param, limit)
                chunks.append(chunk)
    data = b"".join(chunks)
    if not data:
        raise bad_request(f"{param}: the URL returned no data", param)
    return data
