"""HTTP scraping of exporter endpoints, bounded by one deadline for the whole scrape."""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass


class ScrapeError(RuntimeError):
    """A scrape failed (unreachable endpoint, timeout, HTTP error, unreadable file)."""


@dataclass(frozen=True, slots=True)
class Scrape:
    """One HTTP scrape: the body, when it was fetched, and from where."""

    url: str
    text: str
    fetched_at: float


def scrape_http(url: str, timeout: float = 5.0, *, max_bytes: int = 256 * 2**20) -> Scrape:
    """GET an exporter endpoint (http/https only); raise ScrapeError clearly.

    ``timeout`` bounds the whole scrape (connect, headers and body), not each read: at the
    deadline a timer shuts the socket down, so an exporter that trickles bytes cannot hold
    the caller longer than ``timeout`` (and a little)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ScrapeError(f"{url}: only http and https endpoints can be scraped")
    if not timeout > 0:
        raise ScrapeError(f"{url}: the timeout must be positive, not {timeout}")
    conn: http.client.HTTPConnection
    try:
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(parts.netloc, timeout=timeout)
        else:
            conn = http.client.HTTPConnection(parts.netloc, timeout=timeout)
    except (http.client.InvalidURL, ValueError) as exc:
        raise ScrapeError(f"{url}: {exc}") from exc
    expired = threading.Event()

    def abort() -> None:
        expired.set()
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    deadline = time.monotonic() + timeout
    timer = threading.Timer(timeout, abort)
    timer.daemon = True
    timer.start()
    chunks: list[bytes] = []
    try:
        conn.request("GET", path, headers={"Accept": "text/plain", "Connection": "close"})
        resp = conn.getresponse()
        if resp.status >= 400:
            raise ScrapeError(f"{url}: HTTP {resp.status} {resp.reason}")
        size = 0
        while size <= max_bytes and not expired.is_set():
            chunk = resp.read1(min(2**16, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if time.monotonic() > deadline:
                expired.set()
        charset = resp.headers.get_content_charset() or "utf-8"
    except ScrapeError:
        raise
    except (http.client.HTTPException, OSError, ValueError) as exc:
        if expired.is_set():
            raise ScrapeError(f"{url}: cannot scrape within {timeout} s: deadline passed") from exc
        raise ScrapeError(f"{url}: cannot scrape within {timeout} s: {exc}") from exc
    finally:
        timer.cancel()
        conn.close()
    if expired.is_set():
        raise ScrapeError(f"{url}: cannot scrape within {timeout} s: deadline passed")
    body = b"".join(chunks)
    if len(body) > max_bytes:
        raise ScrapeError(f"{url}: response larger than {max_bytes} bytes")
    try:
        text = body.decode(charset, errors="replace")
    except LookupError:
        text = body.decode("utf-8", errors="replace")
    return Scrape(url=url, text=text, fetched_at=time.time())
