"""The ``Worker`` members every host answers alike: the replica's name and its devices, fixed
when the worker is built."""

from __future__ import annotations

from collections.abc import Sequence


class WorkerIdentity:
    def __init__(self, name: str, devices: Sequence[str]) -> None:
        self._name = name
        self._devices = tuple(devices)

    @property
    def name(self) -> str:
        return self._name

    @property
    def devices(self) -> Sequence[str]:
        return self._devices
