"""A port the server was told to listen on that it cannot have: one clear error, the same for
the gRPC, HTTP and metrics ports, instead of a bind traceback."""

from __future__ import annotations


class PortUnavailable(OSError):
    """``what`` (e.g. "gRPC", "HTTP") could not listen on ``address``; ``flag`` is the option
    that chooses its port."""

    def __init__(self, what: str, address: str, flag: str, reason: str) -> None:
        super().__init__(f"cannot listen for {what} on {address} ({reason}); choose another "
                         f"port with {flag} (0: any free port)")
