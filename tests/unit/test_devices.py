import pytest

from evenflow.server.workers.devices import DeviceSpec, lowest_free_index, parse_devices


def test_parse_mixed_devices() -> None:
    assert parse_devices("cpu:0,cpu:1,sim:0.5,sim:1,cuda:3") == [
        DeviceSpec("cpu", 0, "cpu0"), DeviceSpec("cpu", 1, "cpu1"),
        DeviceSpec("sim", 0, "sim0", 0.5), DeviceSpec("sim", 1, "sim1", 1.0),
        DeviceSpec("cuda", 3, "cuda3")]


def test_bare_cpu_counts_up() -> None:
    assert [d.name for d in parse_devices("cpu,cpu")] == ["cpu0", "cpu1"]


@pytest.mark.parametrize(("text", "message"), [
    ("tpu:0", "unknown device"), ("sim:-1", "speed must be a finite number > 0"),
    ("sim:fast", "sim:SPEED"),
    ("sim:nan", "speed must be a finite number > 0"),
    ("sim:inf", "speed must be a finite number > 0"), ("sim:0", "speed must be"),
    ("cuda:x", "cuda:N"), ("cpu:0,cpu:0", "listed twice"), ("cpu,,cpu", "empty device")])
def test_bad_devices_are_named(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_devices(text)


def test_a_device_joining_takes_the_lowest_index_free_so_a_returning_node_keeps_its_names(
        ) -> None:
    devices = parse_devices("cuda:0,cuda:2,sim:1")  # cuda1's node left
    assert lowest_free_index(devices, "cuda") == 1
    assert lowest_free_index(devices, "sim") == 1
    assert lowest_free_index([], "cuda") == 0
