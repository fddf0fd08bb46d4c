"""The configuration file: validation messages, flags over the file, one place for defaults."""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

import pytest

from evenflow.balancer import Policy
from evenflow.server.config.cli import add_serve_arguments, config_from_args, main
from evenflow.server.config.deployment_file import ConfigError, file_defaults, load
from evenflow.server.config.server_config import ServerConfig

pytestmark = pytest.mark.timeout(30)

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "evenflow.toml"

BAD_FILES = [
    ("unknown key", "[server]\nprot = 8001\n", "server.prot: unknown key"),
    ("unknown section", "[sever]\nport = 8001\n", "sever: unknown key"),
    ("unknown model key", '[models.m]\nsource = "mlp"\nmax_bach = 8\n',
     "models.m.max_bach: unknown key"),
    ("wrong type", '[server]\nport = "8001"\n', "server.port = '8001': Input should be a valid "
                                                  "integer"),
    ("wrong type, bool", '[balancing]\nwork_stealing = "yes"\n', "balancing.work_stealing"),
    ("out of range", "[server]\nport = 70000\n", "server.port = 70000"),
    ("unknown device", '[devices]\nlist = ["cuda:0", "tpu:1"]\n',
     "devices.list = ['cuda:0', 'tpu:1']: unknown device 'tpu:1'"),
    ("unknown policy", '[balancing]\npolicy = "fastest"\n', "balancing.policy = 'fastest'"),
    ("batch bigger than the queue", "[balancing]\nmax_batch = 64\nmax_queued_requests = 16\n",
     "balancing.max_batch = 64: a full batch cannot fit"),
    ("a model's batch bigger than the queue",
     '[balancing]\nmax_queued_requests = 16\n[models.m]\nsource = "mlp"\nmax_batch = 32\n',
     "models.m.max_batch = 32: a full batch cannot fit"),
    ("zero batch", '[models.m]\nsource = "mlp"\nmax_batch = 0\n', "models.m.max_batch = 0"),
    ("wait past the target", "[balancing]\nmax_wait_ms = 80\nlatency_target_ms = 50\n",
     "balancing.max_wait_ms = 80.0: must be below latency_target_ms"),
    ("pipelines that cannot form",
     '[devices]\nlist = ["cpu:0", "cpu:1", "cpu:2"]\n[balancing]\npipeline_stages = 2\n',
     "balancing.pipeline_stages = 2: 3 devices cannot form pipelines of 2 stages"),
    ("missing file source", '[models.m]\nsource = "/nonexistent/model.pt2"\n',
     "models.m.source = '/nonexistent/model.pt2': no such file"),
    ("missing module source", '[models.m]\nsource = "no_such_package.models:build"\n',
     "models.m.source = 'no_such_package.models:build': no module"),
    ("unknown built-in", '[models.m]\nsource = "resnet"\n', "models.m.source = 'resnet'"),
    ("model without source", "[models.m]\nmax_batch = 8\n", "models.m.source: required"),
    ("bad tensor shape", '[models.m]\nsource = "mlp"\n'
     'inputs = [{name = "x", datatype = "FP32", shape = [8, 256]}]\n',
     "models.m.inputs.0.shape = [8, 256]: must start with the batch dimension"),
    ("bad datatype", '[models.m]\nsource = "mlp"\n'
     'inputs = [{name = "x", datatype = "FLOAT", shape = [-1, 256]}]\n',
     "models.m.inputs.0.datatype = 'FLOAT'"),
    ("default level outside the levels", "[balancing]\npriority_levels = 2\n"
     "default_priority_level = 3\n", "balancing.default_priority_level = 3: must be one of"),
    ("front-end processes", "[server]\nfrontends = 0\n", "server.frontends = 0"),
    ("worker host", "[server]\nworkers = \"threads\"\n", "server.workers"),
    ("not TOML", "[server\nport = 1\n", "not TOML"),
    ("message size past gRPC's int32", "[server]\nmax_message_bytes = 2147483648\n",
     "server.max_message_bytes = 2147483648: at most 2147483647"),
    ("GIL switch interval inf", "[server]\ngil_switch_interval_us = inf\n",
     "server.gil_switch_interval_us = inf"),
    ("GIL switch interval past a second", "[server]\ngil_switch_interval_us = 1e20\n",
     "server.gil_switch_interval_us = 1e+20"),
    ("GIL switch interval under a microsecond", "[server]\ngil_switch_interval_us = 0.5\n",
     "server.gil_switch_interval_us = 0.5"),
    ("device memory inf", '[devices]\nmemory = { cuda0 = "inf" }\n',
     "devices.memory.cuda0 = 'inf': not a finite size"),
    ("device memory past a float", '[devices]\nmemory = { cuda0 = "1e400" }\n',
     "devices.memory.cuda0 = '1e400': not a finite size"),
    ("device memory nan", '[devices]\nmemory = { cuda0 = "nan" }\n',
     "devices.memory.cuda0 = 'nan': not a finite size"),
    ("device memory under a byte", '[devices]\nmemory = { cuda0 = "0.1B" }\n',
     "devices.memory.cuda0 = '0.1B': under 1 byte"),
    ("model memory inf", '[models.m]\nsource = "sim"\nmemory_gib = inf\n',
     "models.m.memory_gib = inf"),
    ("model memory under a byte", '[models.m]\nsource = "sim"\nmemory_gib = 1e-12\n',
     "models.m.memory_gib = 1e-12: under 1 byte"),
    ("sim device of speed nan", '[devices]\nlist = ["sim:nan"]\n',
     "devices.list = ['sim:nan']: bad device 'sim:nan': speed must be a finite number > 0"),
    ("batch bigger than the queued samples", "[balancing]\nmax_queued_samples = 16\n",
     "balancing.max_batch = 64: a full batch cannot fit in the admission bound "
     "(max_queued_samples = 16"),
    ("a model's batch bigger than the queued samples",
     '[balancing]\nmax_queued_samples = 16\nmax_batch = 8\n'
     '[models.m]\nsource = "mlp"\nmax_batch = 32\n',
     "models.m.max_batch = 32: a full batch cannot fit"),
    ("a model's queued samples below the batch",
     '[models.m]\nsource = "mlp"\nmax_batch = 8\nmax_queued_samples = 4\n',
     "models.m.max_batch = 8: a full batch cannot fit in the admission bound "
     "(max_queued_samples = 4, models.m.max_queued_samples)"),
    ("no auth groups", "[security]\nauth_groups = []\n",
     "security.auth_groups = []: name at least one group"),
]


@pytest.mark.parametrize(("text", "message"), [(t, m) for _, t, m in BAD_FILES],
                         ids=[case for case, _, _ in BAD_FILES])
def test_check_config_names_the_key_value_and_reason(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert main(["check-config", str(path)]) == 1
    err = capsys.readouterr().err
    assert message in err, err


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[server]\nport = -1\nhots = 'x'\n[devices]\ncpu_threads = 0\n")
    with pytest.raises(ConfigError) as caught:
        load(path, {})
    assert [p.key for p in caught.value.problems] == [
        "server.port", "server.hots", "devices.cpu_threads"]


def test_nothing_set_gives_the_config_defaults() -> None:
    assert load(None, {}) == ServerConfig()


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[server]\nport = 9000\nhost = "0.0.0.0"\n[balancing]\nmax_batch = 16\n'
                    '[models.a]\nsource = "sim"\nmax_batch = 4\n[models.b]\nsource = "mlp"\n')
    config = load(path, {"server": {"port": 0}, "balancing": {"policy": "pow2"},
                         "models": {"c": {"source": "sim"}}})
    assert (config.host, config.port) == ("0.0.0.0", 0)
    models = {m.name: m for m in config.model_configs()}
    assert sorted(models) == ["a", "b", "c"]
    assert models["a"].balancer is not None and models["a"].balancer.max_batch == 4
    assert models["b"].balancer is not None and models["b"].balancer.max_batch == 16
    assert all(m.balancer is not None and m.balancer.policy is Policy.POW2
               for m in models.values())


def test_the_example_file_is_valid_and_its_commented_defaults_are_true() -> None:
    load(EXAMPLE, {})
    defaults = file_defaults()
    section = None
    checked = 0
    for line in EXAMPLE.read_text().splitlines():
        if heading := re.match(r"^\[([\w.]+)\]", line):
            section = heading.group(1)
        commented = re.match(r"^# (\w+) = (.+?)\s*(#.*)?$", line)
        if commented and section in defaults \
                and defaults[section][commented.group(1)] is not None:  # None: an example
            key, value = commented.group(1), commented.group(2)
            assert tomllib.loads(f"v = {value}")["v"] == defaults[section][key], (section, key)
            checked += 1
    assert checked >= 25, "the example file's defaults were not found"


def test_help_shows_the_defaults_of_the_config_classes(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    config = ServerConfig()
    assert f"(default {config.balancer.max_batch})" in text
    assert f"(default {config.port})" in text


@pytest.mark.parametrize(("flags", "message"), [
    (["--max-message-bytes", "2147483648"], "server.max_message_bytes = 2147483648"),
    (["--gil-switch-interval-us", "inf"], "server.gil_switch_interval_us = inf"),
    (["--device-memory", "cuda0=inf"], "devices.memory.cuda0 = 'inf': not a finite size"),
    (["--devices", "sim:inf"], "speed must be a finite number > 0"),
    (["--max-queue-samples", "8"], "balancing.max_batch = 64: a full batch cannot fit"),
    (["--auth-groups", ""], "security.auth_groups"),
    (["--model", "a=sim", "--model", "a=mlp"], "--model = 'a=mlp': model 'a' given twice"),
])
def test_check_config_names_the_key_of_a_bad_flag(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
        message: str) -> None:
    path = tmp_path / "empty.toml"
    path.write_text("")
    assert main(["check-config", str(path), *flags]) == 1
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err


def test_a_repeated_model_flag_is_refused_before_anything_starts() -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(["--model", "a=sim", "--model", "a=mlp"])
    with pytest.raises(ConfigError, match="model 'a' given twice"):
        config_from_args(args)


def test_an_unbounded_queue_delay_stays_allowed() -> None:
    config = load(None, {"balancing": {"max_queue_delay_ms": float("inf")},
                         "devices": {"memory": {"sim0": "1.5GiB"}},
                         "server": {"gil_switch_interval_us": 1.0,
                                    "max_message_bytes": 2**31 - 1}})
    assert config.balancer.max_queue_delay_s == float("inf")
    assert config.device_memory_bytes == {"sim0": 3 * 2**29}
    assert config.max_message_bytes == 2**31 - 1


def test_help_says_the_default_of_metrics_and_device_memory(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default off)" not in text  # "off" is not a value --metrics-port takes
    assert "not given: no metrics are served" in text
    assert "total less a tenth, at most its free memory" not in text
    assert "free memory at start less a tenth of its total" in text


def test_the_documented_keys_are_the_schema() -> None:
    """docs/configuration.md's table of sections names every key of the file's schema."""
    from evenflow.server.config.deployment_file import ModelSection, Settings

    docs = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    rows = dict(re.findall(r"^\| `\[(\w+)(?:\.NAME)?\]` \| (.+) \|$", docs, re.MULTILINE))
    for section, field in Settings.model_fields.items():
        if section == "models":
            keys = [*ModelSection.model_fields]
            documented = rows["models"] + rows["balancing"]
        else:
            annotation = field.annotation
            assert isinstance(annotation, type)
            keys = [f.alias or name for name, f in annotation.model_fields.items()]
            documented = rows[section]
        missing = [key for key in keys if f"`{key}`" not in documented]
        assert not missing, (section, missing)


def test_check_config_notes_placement_keys_that_placement_all_ignores(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "pinned.toml"
    path.write_text('[models.a]\nsource = "sim"\npinned = ["sim0"]\nmin_replicas = 0\n'
                    '[models.b]\nsource = "sim"\nmax_replicas = 2\n')
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "note: models.a.pinned, models.a.min_replicas, models.b.max_replicas steer " \
           'placement = "auto"' in out, out
    assert main(["check-config", str(path), "--placement", "auto"]) == 0
    assert ": note:" not in capsys.readouterr().out
