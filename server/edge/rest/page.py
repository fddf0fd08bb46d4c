"""The devices page (``GET /`` on the HTTP port): one static file shipped in the package that
polls ``/evenflow/v1/stats`` each second; see docs/devices-page.md."""

from __future__ import annotations

from importlib import resources


def devices_page() -> bytes:
    return (resources.files("evenflow.server.edge.rest") / "static" / "devices.html").read_bytes()
