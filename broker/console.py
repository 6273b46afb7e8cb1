"""The web console (docs/console.md): static files under /ui/, shipped in the package (broker/ui).

The files themselves are public (they hold no data); everything they show comes from the
/v1 API with the user's bearer token, which the page asks for when the daemon answers 401.
Only the files in broker/ui are served, by exact name: no path from the URL reaches the disk.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

UI_DIR = Path(__file__).resolve().parent / "ui"
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
# No inline script or style, nothing from another origin: what the console runs is what it ships.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _files() -> dict[str, Path]:
    return {p.name: p for p in UI_DIR.iterdir() if p.is_file() and p.suffix in CONTENT_TYPES}


async def index_redirect(request: web.Request) -> web.StreamResponse:
    raise web.HTTPPermanentRedirect("/ui/")


async def static(request: web.Request) -> web.Response:
    name = request.match_info.get("name") or "index.html"
    path = _files().get(name)
    if path is None:
        raise web.HTTPNotFound(reason=f"no console file {name!r}")
    return web.Response(body=path.read_bytes(), headers={"Content-Type": CONTENT_TYPES[path.suffix],
                                                         **SECURITY_HEADERS})


def routes() -> list[web.RouteDef]:
    return [web.get("/ui", index_redirect, allow_head=False),
            web.get("/ui/", static, allow_head=False),
            web.get("/ui/{name}", static, allow_head=False)]
