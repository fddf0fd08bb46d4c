"""What a replica's Ray actor asks for and how it numbers its devices (pure arithmetic: no
Ray needed)."""

from __future__ import annotations

from evenflow.server.workers.devices import parse_devices
from evenflow.server.workers.ray_resources import (
    GPU_SHARE,
    SIM_CPU_SHARE,
    SIM_RESOURCE,
    actor_devices,
    actor_resources,
    placement_report,
)


def test_two_models_on_one_gpu_both_fit_on_it() -> None:
    """Issue 23.7: each cuda replica asked a whole GPU, so a second model's was never placed."""
    (device,) = parse_devices("cuda:0")
    first, second = (actor_resources([device]) for _ in range(2))
    assert first.num_gpus + second.num_gpus <= 1.0
    assert first.pinned_gpu == second.pinned_gpu == "cuda0"  # the same GPU, not any GPU
    assert first.asks() == {"GPU": GPU_SHARE}


def test_a_reload_beside_every_models_replica_still_fits_on_the_gpu() -> None:
    """A share of 1 / (models known) filled the GPU's bundle once every model had a replica
    there: a reload's new replica, built before the old one drains, then waited for the
    placement timeout and the reload failed."""
    (device,) = parse_devices("cuda:0")
    models = 8
    actors = [actor_resources([device]) for _ in range(models + 1)]  # + the reload's
    assert sum(a.num_gpus for a in actors) <= 1.0
    assert round(GPU_SHARE * 10_000) == GPU_SHARE * 10_000  # Ray keeps 0.0001


def test_a_pipeline_over_several_gpus_asks_whole_ones() -> None:
    wants = actor_resources(parse_devices("cuda:0,cuda:1"))
    assert (wants.num_gpus, wants.pinned_gpu) == (2.0, None)  # Ray: fractions only below one


def test_cuda_ordinals_in_the_actor_for_any_device_order() -> None:
    """The actor sees only its own GPUs, as 0, 1, ...: a cpu stage first used to keep cuda:1
    as ordinal 1 (numbering was fixed only when the first device was cuda)."""
    cpu, cuda = actor_devices(parse_devices("cpu,cuda:1"))
    assert (cpu.kind, cpu.index, cpu.name) == ("cpu", 0, "cpu0")
    assert (cuda.kind, cuda.index, cuda.name) == ("cuda", 0, "cuda1")
    first, middle, last = actor_devices(parse_devices("cuda:3,cpu,cuda:1"))
    assert [(d.name, d.index) for d in (first, middle, last)] == \
        [("cuda3", 0), ("cpu0", 0), ("cuda1", 1)]


def test_sim_devices_ask_a_small_cpu_share() -> None:
    """Issue 20.4: each sim device asked a whole CPU; four of them never all started on two."""
    devices = parse_devices("sim:1,sim:1,sim:0.5,sim:0.25")
    asks = [actor_resources([d]).asks() for d in devices]
    assert asks == [{"CPU": SIM_CPU_SHARE}] * 4
    assert sum(a["CPU"] for a in asks) <= 2  # the local cluster here: two CPUs
    assert SIM_CPU_SHARE > 0  # never 0: a head started with --num-cpus 0 stays free
    assert actor_resources(devices[:1], sim_resource_offered=True).asks() == \
        {"CPU": SIM_CPU_SHARE, SIM_RESOURCE: 1.0}


def test_cpu_devices_ask_a_cpu_each() -> None:
    assert actor_resources(parse_devices("cpu")).asks() == {"CPU": 1.0}
    assert actor_resources(parse_devices("cpu:0,cpu:1")).asks() == {"CPU": 2.0}


def test_the_report_names_the_replica_its_request_and_the_cluster() -> None:
    report = placement_report("sim@cuda0", {"GPU": 1.0}, {"CPU": 2.0}, {"CPU": 2.0},
                              [{"CPU": 2.0}])
    assert report == ("replica sim@cuda0 asks Ray for {GPU 1}; the cluster has GPU 0 free of "
                      "0 (no node of the cluster has that much)")
    busy = placement_report("m@cpu2", {"CPU": 1.0}, {"CPU": 2.0}, {"CPU": 0.0},
                            [{"CPU": 1.0}, {"CPU": 1.0}])
    assert "CPU 0 free of 2" in busy and "a node has that much: the actor is starting" in busy
