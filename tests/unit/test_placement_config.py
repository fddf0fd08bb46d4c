"""The placement's configuration: flags, file keys and their checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from evenflow.server.config.cli import config_from_args, main
from evenflow.server.config.deployment_file import ConfigError, load, parse_size_bytes
from evenflow.server.config.server_config import ServerConfig


def test_sizes_take_binary_and_decimal_units() -> None:
    assert parse_size_bytes("16GiB") == 16 * 2**30
    assert parse_size_bytes("512MiB") == 512 * 2**20
    assert parse_size_bytes("8GB") == 8 * 10**9
    assert parse_size_bytes("1024") == 1024
    for bad in ("lots", "-1GiB", "3TiB", ""):
        with pytest.raises(ValueError, match="not a size"):
            parse_size_bytes(bad)


def test_the_file_sets_placement_memory_and_per_model_bounds(tmp_path: Path) -> None:
    path = tmp_path / "evenflow.toml"
    path.write_text("""
[server]
placement = "auto"
[devices]
list = ["sim:1", "sim:0.5"]
memory = { sim0 = "16GiB", sim1 = "8GiB" }
[models.a]
source = "sim"
min_replicas = 0
max_replicas = 2
pinned = ["sim1"]
memory_gib = 7
sim_base_ms = 4
sim_load_ms = 250
""")
    config = load(path, {})
    assert config.placement == "auto"
    assert config.device_memory_bytes == {"sim0": 16 * 2**30, "sim1": 8 * 2**30}
    (model,) = config.model_configs()
    assert (model.min_replicas, model.max_replicas, model.pinned) == (0, 2, ("sim1",))
    assert model.memory_bytes == 7 * 2**30
    assert model.sim_profile is not None and model.sim_profile.base_ms == 4.0
    assert model.sim_profile.per_sample_ms == 2.0  # the default where unset
    assert model.sim_load_s == 0.25


def test_the_defaults_keep_every_model_on_every_device() -> None:
    config = ServerConfig()
    assert config.placement == "all" and config.device_memory_bytes == {}
    with pytest.raises(ValueError, match="placement must be one of"):
        ServerConfig(placement="some")


def test_unknown_devices_and_crossed_bounds_are_refused_together(tmp_path: Path) -> None:
    path = tmp_path / "evenflow.toml"
    path.write_text("""
[devices]
list = ["sim:1"]
memory = { sim7 = "8GiB" }
[models.a]
source = "sim"
min_replicas = 3
max_replicas = 1
pinned = ["cuda0"]
""")
    with pytest.raises(ConfigError) as caught:
        load(path, {})
    text = str(caught.value)
    assert "devices.memory.sim7" in text and "no such device" in text
    assert "models.a.min_replicas" in text and "max_replicas" in text
    assert "models.a.pinned" in text and "cuda0" in text


def test_a_size_that_is_no_size_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evenflow.toml"
    path.write_text('[devices]\nmemory = { sim0 = "plenty" }\n')
    with pytest.raises(ConfigError, match="'plenty' is not a size"):
        load(path, {})


def test_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from evenflow.server.config.cli import add_serve_arguments

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(["--devices", "sim:1,sim:1", "--placement", "auto",
                              "--device-memory", "sim0=4GiB,sim1=2GiB"])
    config = config_from_args(args)
    assert config.placement == "auto"
    assert config.device_memory_bytes == {"sim0": 4 * 2**30, "sim1": 2 * 2**30}
    with pytest.raises(SystemExit):
        main(["serve", "--device-memory", "sim0"])
    assert "DEVICE=SIZE" in capsys.readouterr().err


def test_more_pins_than_max_replicas_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "evenflow.toml"
    path.write_text("""
[devices]
list = ["sim:1", "sim:1", "sim:1"]
[models.a]
source = "sim"
max_replicas = 2
pinned = ["sim0", "sim1", "sim2"]
[models.b]
source = "sim"
max_replicas = 2
pinned = ["sim0", "sim1", "sim1"]
""")
    with pytest.raises(ConfigError) as caught:
        load(path, {})
    (problem,) = caught.value.problems
    assert problem.key == "models.a.max_replicas"
    assert "below the 3 devices in pinned" in problem.reason


def test_pins_are_checked_for_their_form_where_the_file_lists_no_devices(
        tmp_path: Path) -> None:
    """The devices are found at start then (the server checks the pins against them); a pin
    that names no device in any server is refused here already."""
    path = tmp_path / "evenflow.toml"
    path.write_text("""
[devices]
memory = { "cuda:1" = "8GiB", cuda0 = "8GiB" }
[models.a]
source = "sim"
pinned = ["cuda0", "cuda:0"]
[models.b]
source = "sim"
pinned = ["sim3", "cpu0", "cuda12"]
""")
    with pytest.raises(ConfigError) as caught:
        load(path, {})
    problems = {p.key: p.reason for p in caught.value.problems}
    assert problems == {
        "devices.memory.cuda:1": "'cuda:1' is not a device name: devices are named cpuN, cudaN "
                                 "or simN ('cuda1' here)",
        "models.a.pinned": "'cuda:0' is not a device name: devices are named cpuN, cudaN or "
                           "simN ('cuda0' here)"}
