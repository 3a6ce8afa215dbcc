"""The dashboard: static HTML/JS/CSS shipped in the package, served at `/ui`.

The page itself holds no data, so it is served without the key; it asks the user for the key
once and sends it with every API call it makes (the API refuses them without it). Nothing is
loaded from the internet: clusters are often air-gapped.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"
PREFIX = "/ui"

router = APIRouter(tags=["dashboard"], include_in_schema=False)


@router.get(PREFIX)
async def ui_root() -> RedirectResponse:
    return RedirectResponse(f"{PREFIX}/")


@router.get(f"{PREFIX}/")
async def ui_index() -> FileResponse:
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


def mount_ui(app: FastAPI) -> None:
    app.include_router(router)
    app.mount(f"{PREFIX}/static", StaticFiles(directory=STATIC), name="ui-static")
