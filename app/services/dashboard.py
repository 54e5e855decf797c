"""The dashboard's and the API docs' files, read from the package and kept in memory.

Every file under ``app/dashboard/static`` and ``app/dashboard/vendor`` is an asset; nothing
else can be named (no path from a request reaches the filesystem). Each asset is read once,
with its strong tag and, for text, a gzip copy made once at gzip's level 9: 2.8 MB of files
(Swagger UI 1.7 MB, ReDoc 0.9 MB, uPlot 0.05 MB, ours under 0.1 MB) and 0.77 MB of gzip
copies, held for the life of the process (measured by summing ``load_asset`` over
``asset_names()``).

Our own assets are addressed with their tag in the query (``app.js?v=<tag>``) and the
vendored ones with their version in the folder name, so both may be cached for a year.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import mimetypes
from dataclasses import dataclass
from importlib import resources

ASSET_KINDS = ("static", "vendor")
SWAGGER_UI = "vendor/swagger-ui-5.32.0"
REDOC = "vendor/redoc-2.5.2"
UPLOT = "vendor/uplot-1.6.32"
"""uPlot (MIT), the dashboard's charts: ``uPlot.iife.min.js`` and ``uPlot.min.css``."""

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; "
    "font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'self'"
)
"""Pages load nothing from another host: a stray reference (ReDoc's footer logo) is refused
by the browser instead of leaving the network. Swagger UI and ReDoc set inline styles;
ReDoc's search runs in a worker made from a blob."""

_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".svg": "image/svg+xml",
    "": "text/plain; charset=utf-8",  # LICENSE, NOTICE
}


@dataclass(frozen=True)
class Asset:
    """One file: its bytes, a gzip copy (None where gzip does not pay), tag and type."""

    body: bytes
    gzipped: bytes | None
    tag: str
    media_type: str


def _media_type(name: str) -> str:
    suffix = name[name.rfind(".") :] if "." in name.rsplit("/", 1)[-1] else ""
    return _TYPES.get(suffix) or mimetypes.guess_type(name)[0] or "application/octet-stream"


@functools.cache
def asset_names() -> frozenset[str]:
    """Every asset path, ``static/app.js`` or ``vendor/redoc-2.5.2/redoc.standalone.js``."""
    root = resources.files("app.dashboard")
    names: set[str] = set()

    def walk(node, prefix: str) -> None:  # noqa: ANN001 - a Traversable
        for child in node.iterdir():
            path = f"{prefix}/{child.name}"
            if child.is_dir():
                walk(child, path)
            elif not child.name.startswith("."):
                names.add(path)

    for kind in ASSET_KINDS:
        walk(root / kind, kind)
    return frozenset(names)


def load_asset(name: str) -> Asset | None:
    """The asset at ``name`` (see :func:`asset_names`), or None when there is none.

    Costs up to ~0.3 s the first time for the largest file (gzip level 9); call it off the
    event loop. Only packaged names are cached (a cache keyed by any requested name
    would grow with every distinct path a client asks for).
    """
    if name not in asset_names():
        return None
    return _load_known_asset(name)


@functools.cache
def _load_known_asset(name: str) -> Asset:
    body = resources.files("app.dashboard").joinpath(name).read_bytes()
    media_type = _media_type(name)
    if name.endswith(".html") and name.startswith("static/"):
        body = _with_versions(body)
    packed = None
    if len(body) >= 1024 and not media_type.startswith("image/png"):
        packed = gzip.compress(body, compresslevel=9, mtime=0)
    return Asset(body, packed, hashlib.blake2b(body, digest_size=16).hexdigest(), media_type)


def _with_versions(html: bytes) -> bytes:
    """Replaces ``{{v:static/app.js}}`` in our HTML with that asset's tag."""
    text = html.decode()
    while "{{v:" in text:
        start = text.index("{{v:")
        end = text.index("}}", start)
        asset = load_asset(text[start + 4 : end])
        text = text[:start] + (asset.tag[:16] if asset else "missing") + text[end + 2 :]
    return text.encode()


def dashboard_page() -> Asset:
    """The dashboard's one HTML page; it renders whichever page its address names."""
    page = load_asset("static/index.html")
    assert page is not None, "app/dashboard/static/index.html is missing from the package"
    return page


def docs_page(kind: str) -> Asset:
    """The offline Swagger UI (``kind="swagger"``) or ReDoc (``"redoc"``) page."""
    page = load_asset(f"static/{kind}.html")
    assert page is not None, f"app/dashboard/static/{kind}.html is missing from the package"
    return page
