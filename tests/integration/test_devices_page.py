"""The live devices page in a real browser: Debian's headless Chromium loads it from a running
``evenflow serve`` with uneven sim devices under load, and every device shows a non-zero rate.

Chromium runs without DevTools: ``--dump-dom`` prints the DOM once ``--virtual-time-budget``
has run out. Virtual time skips the page's one-second waits but stops while a fetch is
pending, so a budget of ten seconds is about ten polls taking only the polls' real time; the
rates the page shows are then measured over that short real span, which is why the check
retries a few loads before failing.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.integration.load import Load
from tests.servers import ServerProcess

CHROMIUM = shutil.which("chromium")

pytestmark = [
    pytest.mark.slow, pytest.mark.timeout(150),
    pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium on the PATH"),
]

SIM_DEVICES = {"sim0": "sim:1", "sim1": "sim:0.5", "sim2": "sim:0.25"}  # name: --devices entry
HTTP_LINE = "evenflow http on "
CLIENTS = 16  # enough closed-loop callers that the slowest device gets work too
VIRTUAL_TIME_MS = 10_000  # about ten polls of the page
CHROMIUM_TIMEOUT_S = 30.0
PAGE_DEADLINE_S = 60.0  # how long the page may take to show every device with a rate
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class PageRows(HTMLParser):
    """The page's replica rows (``data-device`` -> ``data-rate``) and its poll count."""

    def __init__(self) -> None:
        super().__init__()
        self.rates: dict[str, float] = {}
        self.healthy: dict[str, bool] = {}
        self.turn_waits: dict[str, float] = {}  # by model, on a device shared by models
        self.polls = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "body":
            self.polls = int(values.get("data-polls") or 0)
        device = values.get("data-device")
        if device is not None and values.get("data-rate") is not None:
            self.rates[device] = float(values["data-rate"] or 0)
            self.healthy[device] = values.get("data-healthy") == "true"
            self.turn_waits[values.get("data-model") or ""] = \
                float(values.get("data-turn-wait") or 0)


def parse_page(dom: str) -> PageRows:
    rows = PageRows()
    rows.feed(dom)
    rows.close()
    return rows


def http_url(server: ServerProcess) -> str:
    """The HTTP address ``evenflow serve --http-port 0`` printed before its gRPC one."""
    for line in server.banner:
        if HTTP_LINE in line:
            return line.split()[-1].rstrip("/")
    raise AssertionError(f"no {HTTP_LINE!r} line before the gRPC address; printed "
                         f"{server.banner!r}; log: {server.log()[-2000:]}")


async def chromium(profile: Path, *args: str) -> bytes:
    """Headless Chromium with ``args``; its stdout. A fresh profile folder per test keeps it off
    the user's profile and its lock; the page's console goes to stderr, where an uncaught
    error fails the call."""
    assert CHROMIUM is not None
    proc = await asyncio.create_subprocess_exec(
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), CHROMIUM_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    log = stderr.decode(errors="replace")
    assert proc.returncode == 0, f"chromium exited {proc.returncode}: {log[-2000:]}"
    errors = [line for line in log.splitlines() if "CONSOLE" in line and "Uncaught" in line]
    assert not errors, errors
    return stdout


async def page_until(profile: Path, url: str, done: Callable[[PageRows], bool]) -> PageRows:
    """Load ``url`` until its rows satisfy ``done`` (bounded by PAGE_DEADLINE_S)."""
    deadline_s = time.monotonic() + PAGE_DEADLINE_S
    while True:
        dom = await chromium(profile, f"--virtual-time-budget={VIRTUAL_TIME_MS}", "--dump-dom",
                             url)
        rows = parse_page(dom.decode())
        if done(rows):
            return rows
        if time.monotonic() > deadline_s:
            raise AssertionError(f"{url} never showed a rate on every device: polls "
                                 f"{rows.polls}, rates {rows.rates}, page {dom[-3000:]!r}")


def every_device_has_a_rate(rows: PageRows) -> bool:
    # Two polls at least: a rate from the page's own window, not the since-start one.
    return rows.polls >= 2 and all(rows.rates.get(name, 0.0) > 0 for name in SIM_DEVICES)


async def test_the_page_shows_every_device_with_a_rate(
        server_factory: Callable[..., ServerProcess], tmp_path: Path) -> None:
    server = server_factory("--model", "sim", "--devices", ",".join(SIM_DEVICES.values()),
                            "--http-port", "0", "--no-warmup")
    base = http_url(server)
    profile = tmp_path / "chromium-profile"
    async with Load(server.url, CLIENTS) as load:
        # Answers flowing before the browser starts: the page then fills on its first polls.
        await load.until(lambda: sum(load.ok.values()) >= 4 * CLIENTS, timeout_s=30)
        rows = await page_until(profile, base + "/", every_device_has_a_rate)
        assert set(rows.rates) == set(SIM_DEVICES), rows.rates
        assert all(rows.healthy.values()), rows.healthy
        # The same page at its named path finds the statistics beside it.
        await page_until(profile, base + "/evenflow/devices", every_device_has_a_rate)
        shot = tmp_path / "devices.png"
        await chromium(profile, f"--virtual-time-budget={VIRTUAL_TIME_MS}", "--hide-scrollbars",
                       "--window-size=1200,800", f"--screenshot={shot}", base + "/")
    assert shot.read_bytes().startswith(PNG_MAGIC)


async def test_models_sharing_a_device_show_how_long_they_wait_for_their_turns(
        server_factory: Callable[..., ServerProcess], tmp_path: Path) -> None:
    server = server_factory("--model", "a=sim", "--model", "b=sim", "--devices", "sim:1",
                            "--sim-base-ms", "20", "--http-port", "0", "--no-warmup")
    base = http_url(server)
    async with Load(server.url, 4, model="a") as a, Load(server.url, 4, model="b") as b:
        await a.until(lambda: sum(a.ok.values()) >= 8, timeout_s=30)
        await b.until(lambda: sum(b.ok.values()) >= 8, timeout_s=30)
        rows = await page_until(tmp_path / "chromium-profile", base + "/",
                                lambda rows: rows.polls >= 2 and len(rows.turn_waits) == 2
                                and all(wait > 0 for wait in rows.turn_waits.values()))
    # Two closed loops of 20 ms batches on one device: each waits for the other's batches.
    assert set(rows.turn_waits) == {"a", "b"}
    assert all(0 < wait <= 1 for wait in rows.turn_waits.values()), rows.turn_waits
