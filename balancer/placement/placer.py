"""The placer: carries out a strategy's moves on live balancers, and loads a model that has no
replica when a request for it arrives.

Every tick it samples each model's demand and its replicas' fits and outstanding work, asks
the strategy for moves, and runs them as tasks it owns:

* an ``add`` reserves the memory, loads and warms up a replica (``ReplicaLoader``), then puts it
  in routing; while it loads, a model with no replica in routing parks its requests
  (``ModelBalancer.expect_replica``), so they wait within their deadlines;
* a ``drop`` waits for the adds of the same model proposed before it, and runs only if the model
  keeps its floor of replicas in routing without this one; the balancer moves the replica's
  queued work to the others and lets its running batch finish before the worker closes, so no
  request is refused or lost because a replica moves;
* an ``add`` that does not fit beside the replicas on its device waits for the drops in flight
  there; one that needs memory a ``drop`` before it frees starts with that drop or not at all
  (``swaps.units``): the budget never runs a drop without the add it makes room for, nor a
  move of a swap whose other move cannot start.

A drop never takes a model below one healthy replica in routing (the balancer's view, not the
placer's: a replica restarting or on a lost device serves nothing), nor drops a pinned replica,
whoever proposed it. A load whose model or device leaves meanwhile is kept out of routing and
its worker closed when it comes; at shutdown a load still in progress is abandoned (it may take
minutes), while a drain in progress finishes (it carries admitted requests).

A model with no replica at all (evicted when idle, or never placed) is loaded where it would
serve fastest, evicting the least recently used idle models on that device if memory is short
(``on_demand``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import functools
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from evenflow.balancer.balancer import ModelBalancer
from evenflow.balancer.capacity import DeviceCost
from evenflow.balancer.job import Worker
from evenflow.balancer.placement.costs import CostBook
from evenflow.balancer.placement.demand import DemandMeter
from evenflow.balancer.placement.inventory import DeviceInfo, ModelProfile, Placement
from evenflow.balancer.placement.moves import Move, floor_replicas
from evenflow.balancer.placement.on_demand import Evictable, on_demand_moves, overflow_replica
from evenflow.balancer.placement.report import (
    DeviceMemory,
    ModelFootprint,
    MoveRecord,
    PlacementSnapshot,
)
from evenflow.balancer.placement.swaps import units
from evenflow.balancer.placement.tuner import MoveBudget
from evenflow.balancer.placement.view import PlacerView, Strategy
from evenflow.balancer.stats import ReplicaSnapshot
from evenflow.balancer.timebase import TimeSource, sleep_s

logger = logging.getLogger(__name__)


class ReplicaLoader(Protocol):
    async def load_replica(self, model: str, device: str) -> Worker:
        """A warmed-up worker for ``model`` on ``device`` (the placer owns it from then).
        Cancelled (the placer abandons a load at shutdown), it closes whatever it built."""
        ...


class ReplicaState(enum.Enum):
    LOADING = "loading"
    SERVING = "serving"
    DRAINING = "draining"


@dataclass(slots=True)
class PlacedReplica:
    model: str
    device: str
    state: ReplicaState
    since_s: float
    worker: Worker | None = None


@dataclass(frozen=True, slots=True)
class PlacerSettings:
    """``tick_s``: how often demand and load are sampled and the strategy asked.
    ``moves_per_minute``: the budget of the strategy's moves, shared by its causes (plans, the
    tuner, overflow swaps); a load on demand and its evictions are neither held to it nor
    counted in it, as requests wait on them. ``on_demand_wait_s``: how long a model with
    parked requests and no memory to load into waits for memory before its requests fail
    (each fails at its own deadline first if it has one). ``idle_s``: a model with nothing in
    flight and no request for this long is idle: its demand is 0 to the strategy, and its
    replicas may be evicted."""

    tick_s: float = 0.5
    moves_per_minute: int = 30
    on_demand_wait_s: float = 30.0
    idle_s: float = 5.0
    recent_moves: int = 64


@dataclass(slots=True)
class _Model:
    template: ModelProfile  # everything but the costs, which the cost book keeps current
    prior: DeviceCost  # its batch cost at speed 1 before it has been measured anywhere
    balancer: ModelBalancer
    demand: DemandMeter = field(default_factory=DemandMeter)
    waiting_since_s: float | None = None  # parked requests and no replica could be loaded

    def observe_demand(self, now_s: float) -> None:
        counters = self.balancer.counters
        self.demand.observe(counters.arrived_samples, counters.arrived_requests, now_s)


class Placer:
    def __init__(self, *, devices: Sequence[DeviceInfo], speeds: Mapping[str, float],
                 loader: ReplicaLoader, strategy: Strategy, time_source: TimeSource,
                 mode: str = "auto", settings: PlacerSettings = PlacerSettings()) -> None:
        self.devices = list(devices)
        self.mode = mode
        self.settings = settings
        self._loader = loader
        self._strategy = strategy
        self._time = time_source
        self._costs = CostBook(speeds)
        self._models: dict[str, _Model] = {}
        self._replicas: dict[tuple[str, str], PlacedReplica] = {}
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        # Moves whose model or device left while they ran: no longer the key's move, still
        # awaited by ``close``.
        self._orphans: set[asyncio.Task[None]] = set()
        self._abandonable: set[asyncio.Task[None]] = set()  # adds before their worker exists
        self._budget = MoveBudget(settings.moves_per_minute)
        self._counts: collections.Counter[str] = collections.Counter()
        self._recent: collections.deque[MoveRecord] = collections.deque(
            maxlen=settings.recent_moves)
        self._loop_task: asyncio.Task[None] | None = None
        self._closing = False
        self._held: collections.Counter[str] = collections.Counter()  # bytes, by device
        self._overcommitted: set[str] = set()  # devices warned about (``_warn_overcommitted``)

    # -- models ---------------------------------------------------------------------------

    def add_model(self, template: ModelProfile, prior: DeviceCost, balancer: ModelBalancer,
                  workers: Mapping[str, Worker]) -> None:
        """Manage ``balancer``'s replicas; ``workers`` are those it was built with, by device."""
        now_s = self._time.clock()
        self._models[template.name] = _Model(template, prior, balancer)
        for device, worker in workers.items():
            self._replicas[(template.name, device)] = PlacedReplica(
                template.name, device, ReplicaState.SERVING, now_s, worker)

    def free_bytes(self) -> dict[str, int]:
        """Each device's memory not held by a replica (loading, serving or draining) or by a
        load outside the placer (``hold``)."""
        return {d.name: d.memory_bytes - self._used_bytes(d.name) for d in self.devices}

    def _used_bytes(self, device: str) -> int:
        return self._held[device] + sum(self._models[name].template.memory_bytes
                                        for (name, where) in self._replicas
                                        if where == device and name in self._models)

    def hold(self, device: str, memory_bytes: int) -> None:
        """Reserve memory for a replica built outside the placer (a model's first replicas,
        loaded by the engine), until ``release``."""
        self._held[device] += memory_bytes
        self._warn_overcommitted()  # the engine raises its hold to what a replica measured

    def release(self, device: str, memory_bytes: int) -> None:
        self._held[device] -= memory_bytes

    def set_load_s(self, name: str, load_s: float) -> None:
        """A replica of ``name`` took ``load_s`` to load and warm up (the planner's load
        time)."""
        model = self._models.get(name)
        if model is not None:
            model.template = replace(model.template, load_s=load_s)

    def raise_memory_bytes(self, name: str, memory_bytes: int) -> None:
        """A replica of ``name`` measured that it needs ``memory_bytes`` (its activation peak
        added): the model's footprint becomes the larger of that and what it was, for every
        replica, since batches of the max size may come to any of them."""
        model = self._models.get(name)
        if model is not None and memory_bytes > model.template.memory_bytes:
            logger.info("model %s: a replica needs %.2f GiB, not %.2f GiB", name,
                        memory_bytes / 2**30, model.template.memory_bytes / 2**30)
            model.template = replace(model.template, memory_bytes=memory_bytes)
            self._warn_overcommitted()

    def _warn_overcommitted(self) -> None:
        """Warn, once while it lasts, about each device whose replicas now reserve more than
        its memory: they were placed by a smaller footprint than one of them then measured.
        Nothing is dropped for it (a measured peak is what a batch may reach, not memory in use
        now); the device's free memory reads negative, so no load goes there until it is back
        within, and a load on demand evicts that much more there (``on_demand``)."""
        over = set()
        for device in self.devices:
            used_bytes = self._used_bytes(device.name)
            if used_bytes <= device.memory_bytes:
                continue
            over.add(device.name)
            if device.name not in self._overcommitted:
                logger.warning("placement: device %s: replicas reserve %.2f GiB, over its %.2f "
                               "GiB, since a measured activation peak raised a footprint",
                               device.name, used_bytes / 2**30, device.memory_bytes / 2**30)
        self._overcommitted = over

    def add_device(self, device: DeviceInfo, speed: float) -> None:
        self.devices.append(device)
        self._costs.set_speed(device.name, speed)

    def remove_device(self, name: str) -> None:
        """The device is leaving: call it before its balancers remove its replicas (which
        waits for their drains), so nothing is placed there meanwhile. Its replicas are no
        longer the placer's; a load in flight there is orphaned (``_orphan``): its worker is
        closed when it comes, not routed to."""
        self.devices = [d for d in self.devices if d.name != name]
        for key in [key for key in self._replicas if key[1] == name]:
            self._orphan(key, self._replicas.pop(key))

    def forget_model(self, name: str) -> list[tuple[str, int]]:
        """Stop managing ``name``: unloaded (its balancer closed its workers), or reloaded (a
        new balancer takes over). Returns the memory its replicas held, by device: a reload
        ``hold``s it until the old replicas have drained and closed. A load in flight for it
        is orphaned (``_orphan``) and its memory held here until its worker is closed, so it is
        not in what this returns. Call it before closing the balancer: a load that finishes
        after that would be put in routing on a closed balancer."""
        model = self._models.pop(name, None)
        if model is not None and not model.balancer.serving:
            # Requests parked for a load in flight: the load is orphaned below and its replica
            # goes to no balancer, so they hear now, not at their deadlines, that none comes.
            model.balancer.cancel_expected(f"model {name!r} was reloaded or unloaded while "
                                           "the request waited for its replica to load")
        freed = []
        for key in [key for key in self._replicas if key[0] == name]:
            replica = self._replicas.pop(key)
            memory_bytes = 0 if model is None else model.template.memory_bytes
            if replica.state is not ReplicaState.LOADING:
                freed.append((key[1], memory_bytes))
            self._orphan(key, replica, memory_bytes)
        self._costs.forget(name)
        return freed

    def _orphan(self, key: tuple[str, str], replica: PlacedReplica,
                memory_bytes: int = 0) -> None:
        """``key``'s model or device left while its move runs. The move is not cancelled: a
        loader cancelled mid-build may leak what it had half built; an add finds its entry
        gone when its load returns and closes the worker (``_add``). The key is freed for new
        moves (a reloaded model's), and ``memory_bytes`` of a load held until it ends."""
        task = self._tasks.pop(key, None)
        if task is None:
            return
        self._orphans.add(task)
        if replica.state is ReplicaState.LOADING and memory_bytes:
            device = key[1]
            self.hold(device, memory_bytes)
            task.add_done_callback(lambda _: self.release(device, memory_bytes))

    def no_replica_callback(self, name: str) -> Callable[[], None]:
        """For the balancer's ``on_no_replica``: load a replica for ``name`` now."""
        return lambda: self._on_demand(name)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._run(),
                                                                 name="evenflow-placer")

    async def close(self) -> None:
        """Stop planning, abandon the loads in progress and wait for every move to end.

        A load may take minutes (or hang in its warm-up), and shutdown should not wait that
        long for a replica nothing is routed to yet: it is cancelled (the loader closes what it
        built), and requests parked for it fail now rather than at the drain's grace. A drain
        in progress finishes: its replica's queued requests went to the others and its
        running batch is answered before its worker closes. A drop not started is skipped."""
        self._closing = True
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        for task in self._abandonable:
            task.cancel()
        moves = {*self._tasks.values(), *self._orphans}
        if moves:  # wait, not gather: a cancelled close must not cancel the drains
            await asyncio.wait(moves)

    async def _run(self) -> None:
        while True:
            await sleep_s(self._time, self.settings.tick_s)
            try:
                self.tick()
            except Exception:  # a planning bug must not stop placement for good
                logger.exception("placement tick failed")

    # -- one tick -------------------------------------------------------------------------

    def profiles(self) -> dict[str, ModelProfile]:
        return {name: replace(model.template, costs={
            d.name: self._costs.cost(name, d.name, model.prior) for d in self.devices})
            for name, model in self._models.items()}

    def _placement(self, *states: ReplicaState) -> Placement:
        return frozenset(key for key, r in self._replicas.items() if r.state in states)

    def _observe_cost(self, name: str, model: _Model, replica: ReplicaSnapshot) -> None:
        """The replica's fit as its model's cost there (``CostBook``): the whole fit where it is
        reliable, else its measurements' mean where it has settled at one batch size."""
        device = replica.devices[0]
        if replica.fit_reliable:
            self._costs.observe(name, device, replica.fit_base_s, replica.fit_per_sample_s,
                                replica.fit_batch_size)
        elif replica.fit_settled:
            self._costs.observe_at(name, device, replica.fit_batch_size, replica.fit_latency_s,
                                   model.prior)

    def view(self) -> PlacerView:
        now_s = self._time.clock()
        mean_work: dict[str, float] = {}
        for name, model in self._models.items():
            works = []
            for replica in model.balancer.snapshot().replicas:
                if len(replica.devices) == 1:
                    self._observe_cost(name, model, replica)
                # A cold replica holding work prices it at infinity (it has not measured
                # itself yet): unknown, so it is left out of the mean, not counted as none.
                if replica.healthy and math.isfinite(replica.outstanding_work_s):
                    works.append(replica.outstanding_work_s)
            model.observe_demand(now_s)
            if works:
                mean_work[name] = sum(works) / len(works)
        return PlacerView(
            now_s=now_s, devices=self.devices, profiles=self.profiles(),
            placement=self._placement(*ReplicaState), serving=self._placement(
                ReplicaState.SERVING),
            demand_per_s={n: self._demand_per_s(n, now_s) for n in self._models},
            long_demand_per_s={n: m.demand.long_per_s for n, m in self._models.items()},
            samples_per_request={n: m.demand.samples_per_request
                                 for n, m in self._models.items()},
            mean_work_s=mean_work, moves_left=self._budget.left(now_s),
            moves_in_flight=len(self._tasks))

    def tick(self) -> None:
        if self._closing:
            return
        view = self.view()
        for name, model in self._models.items():
            if model.balancer.parked_requests and not any(
                    key[0] == name for key in self._replicas):
                self._on_demand(name)
        self.carry_out(self._strategy.moves(view))

    # -- moves ----------------------------------------------------------------------------

    def carry_out(self, moves: Sequence[tuple[Move, str]], *, budgeted: bool = True) -> None:
        """Start ``moves`` in order, within the budget unless not ``budgeted``; each waits for
        the earlier moves it depends on (see the module's docstring). A swap (``swaps.units``)
        starts whole or not at all: if one of its moves cannot start (its replica is moving
        already, or gone), neither does the rest, as an add without the drop it counts on
        would only fail for memory, and a drop without its add only cost a replica. The budget
        is spent by the units that start: the first that does not fit ends the list."""
        if self._closing:
            return
        now_s = self._time.clock()
        earlier: list[tuple[Move, asyncio.Task[None]]] = []
        left = self._budget.left(now_s)
        for unit in units(moves):
            claimed: set[tuple[str, str]] = set()
            if not all(self._startable(move, claimed) for move, _ in unit):
                continue
            if budgeted and len(unit) > left:
                break
            for move, reason in unit:
                earlier.append((move, self._start(move, reason, earlier, now_s)))
            if budgeted:
                self._budget.spend(now_s, len(unit))
                left -= len(unit)

    def _startable(self, move: Move, claimed: set[tuple[str, str]]) -> bool:
        """Whether ``move`` would start now (nothing else moves its replica); ``claimed``:
        the keys of the moves before it in its unit."""
        key = (move.model, move.device)
        if move.model not in self._models or key in self._tasks or key in claimed:
            return False
        claimed.add(key)
        if move.kind == "add":
            return key not in self._replicas
        replica = self._replicas.get(key)
        return replica is not None and replica.state is ReplicaState.SERVING

    def _start(self, move: Move, reason: str, earlier: list[tuple[Move, asyncio.Task[None]]],
               now_s: float) -> asyncio.Task[None]:
        key = (move.model, move.device)
        # Captured now, while ``_startable`` holds: by the time the move's task first runs, or
        # has waited for the moves before it, a reload may have put another model under the
        # same name, whose replicas this move must not touch.
        model = self._models[move.model]
        if move.kind == "add":
            placeholder = PlacedReplica(move.model, move.device, ReplicaState.LOADING, now_s)
            self._replicas[key] = placeholder
            # One that does not fit beside the replicas there now counts on the memory that the
            # drops in flight there free: its swap's, or (on demand) ``_freeing_bytes``.
            after = [] if self._fits(move) else self._drops_in_flight(move.device)
            work = self._add(move, reason, model, after, placeholder)
        else:
            adds = [(m, task) for m, task in earlier if m.kind == "add" and m.model == move.model]
            work = self._drop(move, reason, model, self._replicas[key], adds)
        task = asyncio.get_running_loop().create_task(work, name=f"evenflow-{move.kind}")
        self._tasks[key] = task
        task.add_done_callback(functools.partial(self._move_finished, key))
        return task

    def _drops_in_flight(self, device: str) -> list[asyncio.Task[None]]:
        return [task for key, task in self._dropping().items() if key[1] == device]

    def _dropping(self) -> dict[tuple[str, str], asyncio.Task[None]]:
        """The drops in flight, by their replica's key (a move in flight on a replica that is
        not loading is its drop)."""
        return {key: task for key, task in self._tasks.items()
                if (replica := self._replicas.get(key)) is not None
                and replica.state is not ReplicaState.LOADING}

    def _move_finished(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self._tasks.get(key) is task:  # an orphan's key may be another move's by now
            del self._tasks[key]
        self._orphans.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.error("placement: a move failed", exc_info=exc)

    def _record(self, move: Move, reason: str, started_s: float, outcome: str) -> None:
        now_s = self._time.clock()
        record = MoveRecord(now_s, move.kind, move.model, move.device, reason,
                            now_s - started_s, outcome)
        self._recent.append(record)
        self._counts[f"{move.kind}/{reason}/{outcome.split(':', maxsplit=1)[0]}"] += 1
        log = logger.info if outcome == "done" else logger.warning
        log("placement: %s %s on %s (%s): %s in %.2f s", move.kind, move.model, move.device,
            reason, outcome, record.took_s)

    async def _add(self, move: Move, reason: str, model: _Model, after: list[asyncio.Task[None]],
                   placeholder: PlacedReplica) -> None:
        """Load ``move``'s replica of ``model`` into routing, unless its entry
        (``placeholder``) is gone by then: its model was forgotten or its device left
        (``_orphan``), and the worker is closed instead. Until the loader returns, ``close``
        may cancel it."""
        started_s = self._time.clock()
        key = (move.model, move.device)
        task = asyncio.current_task()
        assert task is not None
        self._abandonable.add(task)
        try:
            if after:  # wait, not gather: cancelling this add must not cancel their drains
                await asyncio.wait(after)
            gone = self._gone(move, model, placeholder)
            if gone is not None:
                self._load_ended(move, model, placeholder)
                self._record(move, reason, started_s, f"skipped: {gone}")
                return
            if not self._fits(move):
                self._load_ended(move, model, placeholder, short_of_memory=True)
                self._record(move, reason, started_s, "skipped: no memory")
                return
            if not model.balancer.serving:
                model.balancer.expect_replica()
            worker = await self._loader.load_replica(move.model, move.device)
        except asyncio.CancelledError:
            self._load_ended(move, model, placeholder)
            self._record(move, reason, started_s, "skipped: abandoned at shutdown")
            raise
        except Exception as exc:
            self._load_ended(move, model, placeholder)
            self._record(move, reason, started_s, f"failed: {exc}")
            return
        finally:
            self._abandonable.discard(task)
        gone = self._gone(move, model, placeholder)
        if gone is not None:  # its balancer may be closed, its device is not ours
            self._load_ended(move, model, placeholder)
            await worker.close()
            self._record(move, reason, started_s, f"skipped: {gone}")
            return
        model.balancer.add_replica(worker)
        self._replicas[key] = PlacedReplica(move.model, move.device, ReplicaState.SERVING,
                                            self._time.clock(), worker)
        model.waiting_since_s = None
        self._record(move, reason, started_s, "done")

    def _gone(self, move: Move, model: _Model, placeholder: PlacedReplica) -> str | None:
        """Why ``move``'s replica may not go into routing any more, if it may not."""
        if self._models.get(move.model) is not model:
            return "model gone"
        if self._replicas.get((move.model, move.device)) is not placeholder:
            return "device gone"
        return "closing" if self._closing else None

    def _load_ended(self, move: Move, model: _Model, placeholder: PlacedReplica, *,
                    short_of_memory: bool = False) -> None:
        """A load ended without a replica: its entry goes, and unless another load of the
        model is in flight (or a replica is in routing) its parked requests fail. A load
        skipped ``short_of_memory`` did not fail, though: the memory it counted on is not free
        (an eviction before it refused to drain), so its requests wait for memory as those of
        a model that fits nowhere now do (``_wait_for_memory``)."""
        key = (move.model, move.device)
        if self._replicas.get(key) is placeholder:
            del self._replicas[key]
        current = self._models.get(move.model) is model
        if model.balancer.serving or (current and self._loading(move.model)):
            return
        if short_of_memory and current and model.balancer.parked_requests:
            self._wait_for_memory(model, self._time.clock())
            return
        model.waiting_since_s = None
        model.balancer.cancel_expected()

    def _loading(self, name: str) -> bool:
        return any(r.state is ReplicaState.LOADING for key, r in self._replicas.items()
                   if key[0] == name)

    def _fits(self, move: Move) -> bool:
        """Whether the device has the memory for ``move``'s replica, counting itself."""
        device = next((d for d in self.devices if d.name == move.device), None)
        return device is not None and self._used_bytes(move.device) <= device.memory_bytes

    async def _drop(self, move: Move, reason: str, model: _Model, replica: PlacedReplica,
                    adds: list[tuple[Move, asyncio.Task[None]]]) -> None:
        """Drain ``replica`` of ``model`` out of routing once the ``adds`` of its model before
        it have ended, unless ``_drop_refusal`` says it must stay."""
        started_s = self._time.clock()
        key = (move.model, move.device)
        if adds:
            await asyncio.wait([task for _, task in adds])
        refusal = self._drop_refusal(move, model, replica, [add for add, _ in adds])
        if refusal is not None:
            self._record(move, reason, started_s, f"skipped: {refusal}")
            return
        assert replica.worker is not None  # a serving replica's (``_startable``)
        replica.state = ReplicaState.DRAINING
        await model.balancer.remove_replica(replica.worker)
        if self._replicas.get(key) is replica:  # not a reloaded model's by now
            del self._replicas[key]
        self._record(move, reason, started_s, "done")

    def _drop_refusal(self, move: Move, model: _Model, replica: PlacedReplica,
                      adds: Sequence[Move]) -> str | None:
        """Why the drop of ``replica`` may not start now, if it may not: it is no longer the
        placer's (its model was forgotten, or reloaded: another record under the same name,
        or its device left), placement is closing, an add it waited for (``adds``) ended
        without a replica (a move whose load failed keeps the replica it meant to replace), or
        ``_keeps``."""
        if self._models.get(move.model) is not model or \
                self._replicas.get((move.model, move.device)) is not replica:
            return "replica gone"
        if self._closing:
            return "closing"
        if not all(self._serves(add.model, add.device) for add in adds):
            return "the replica it waited for did not load"
        return self._keeps(model, replica)

    def _serves(self, name: str, device: str) -> bool:
        replica = self._replicas.get((name, device))
        return replica is not None and replica.state is ReplicaState.SERVING

    def _keeps(self, model: _Model, replica: PlacedReplica) -> str | None:
        """Why ``replica`` must stay, if it must. Every drop passes here, whoever proposed
        it: a pinned replica stays where the configuration put it; and the model keeps its
        floor of replicas that serve now, counted by the balancer's health (a replica
        restarting or on a lost device is still the placer's, and serves nothing), and one
        while it has any other replica: with none in routing, requests would park and no load
        would start, since the model is not without a replica (``_on_demand``)."""
        if replica.device in model.template.pinned:
            return "pinned there"
        name = model.template.name
        in_routing = [r.worker for r in model.balancer.replicas if r.healthy]
        # A replica draining is leaving: an idle model whose replicas are all evicted at once
        # keeps none (its next request loads one), not the last one to be asked.
        others = [r for (n, _), r in self._replicas.items()
                  if n == name and r is not replica and r.state is not ReplicaState.DRAINING]
        healthy = sum(1 for r in others if r.state is ReplicaState.SERVING
                      and any(w is r.worker for w in in_routing))
        floor = floor_replicas(model.template, self._demand_per_s(name, self._time.clock()))
        need = max(floor, 1) if others else floor
        if healthy < need:
            return f"it would leave {healthy} healthy replicas in routing, under {need}"
        return None

    # -- a model with no replica ------------------------------------------------------------

    def _on_demand(self, name: str) -> None:
        model = self._models.get(name)
        if model is None or self._closing or any(key[0] == name for key in self._replicas):
            return
        moves = self._on_demand_moves(name)
        if moves is not None:
            model.balancer.expect_replica()
            # Not held to the budget: requests are waiting on this load.
            self.carry_out([(move, "demand") for move in moves], budgeted=False)
            if self._loading(name):
                return
        self._wait_for_memory(model, self._time.clock())

    def _wait_for_memory(self, model: _Model, now_s: float) -> None:
        """No load of ``model`` can start for want of memory: its parked requests wait for
        memory to free up (the tick asks ``_on_demand`` again), for ``on_demand_wait_s`` from
        when the wait began; a load started meanwhile and skipped for memory does not restart
        that clock. Then they fail."""
        if model.waiting_since_s is None:
            model.waiting_since_s = now_s
            model.balancer.expect_replica()
            logger.warning("placement: no device has memory for %s now", model.template.name)
        elif now_s - model.waiting_since_s > self.settings.on_demand_wait_s:
            model.waiting_since_s = None
            model.balancer.cancel_expected()

    def _on_demand_moves(self, name: str) -> list[Move] | None:
        profiles = self.profiles()
        evictable: dict[str, list[Evictable]] = collections.defaultdict(list)
        for (model, device) in self._replicas:
            if self._evictable(model, device, profiles):
                evictable[device].append(Evictable(
                    model, self._models[model].template.memory_bytes,
                    self._models[model].demand.last_arrival_s))
        free = self.free_bytes()
        for device, memory_bytes in self._freeing_bytes().items():
            free[device] += memory_bytes  # the add waits for those drops (``_start``)
        return on_demand_moves(profiles[name], self.devices, free, evictable)

    def _freeing_bytes(self) -> collections.Counter[str]:
        """The memory that drops in flight will free, by device. A load that counts on it
        waits for them (``_start``); one that started first holds its share already (its entry
        counts in ``free_bytes`` from its start), so no two loads count on the same bytes."""
        freeing: collections.Counter[str] = collections.Counter()
        for name, device in self._dropping():
            if (model := self._models.get(name)) is not None:
                freeing[device] += model.template.memory_bytes
        return freeing

    def _evictable(self, name: str, device: str, profiles: Mapping[str, ModelProfile]) -> bool:
        """A replica that serves, above its model's configured minimum, of an idle model or
        an overflow one (``overflow_replica``), that a drop would take (``_keeps``): an
        eviction the drop would refuse would only make the load after it fail for memory. Not
        one a drop has taken already: a second drop of it could not start, and what its drop
        frees counts as free (``_freeing_bytes``). The least recently used go first, so an
        idle model's replica goes before an overflow replica of a busy one."""
        model = self._models.get(name)
        replica = self._replicas.get((name, device))
        if model is None or replica is None or replica.state is not ReplicaState.SERVING \
                or (name, device) in self._tasks:
            return False
        count = sum(1 for (n, _) in self._replicas if n == name)
        if count <= model.template.min_replicas:
            return False
        serving = [where for (n, where), r in self._replicas.items()
                   if n == name and r.state is ReplicaState.SERVING]
        if not (self._idle(name, self._time.clock())
                or overflow_replica(profiles[name], device, serving)):
            return False
        return self._keeps(model, replica) is None

    def _demand_per_s(self, name: str, now_s: float) -> float:
        """The demand the strategy plans for, and the drops are checked against: 0 for an idle
        model; else the short window's rate, or the long one's while the short window happens
        to hold no request (a model with sparse requests is not idle, so it keeps a replica)."""
        if self._idle(name, now_s):
            return 0.0
        meter = self._models[name].demand
        return meter.short_per_s or max(meter.long_per_s, 1e-9)

    def _idle(self, name: str, now_s: float) -> bool:
        """Nothing in flight, and no request for ``idle_s``."""
        model = self._models[name]
        model.observe_demand(now_s)
        return not model.balancer.admitted_requests and \
            model.demand.idle_for_s(now_s) >= self.settings.idle_s

    # -- readers --------------------------------------------------------------------------

    def snapshot(self) -> PlacementSnapshot:
        return PlacementSnapshot(
            mode=self.mode,
            replicas=tuple(sorted((r.model, r.device, r.state.value)
                                  for r in self._replicas.values())),
            moves=dict(self._counts), recent=tuple(self._recent),
            demand_per_s={n: m.demand.short_per_s for n, m in self._models.items()},
            requests_per_s={n: m.demand.short_requests_per_s for n, m in self._models.items()},
            long_demand_per_s={n: m.demand.long_per_s for n, m in self._models.items()},
            long_requests_per_s={n: m.demand.long_requests_per_s
                                 for n, m in self._models.items()},
            devices=tuple(DeviceMemory(d.name, d.memory_bytes, self._used_bytes(d.name))
                          for d in self.devices),
            models=tuple(ModelFootprint(n, m.template.memory_bytes, m.template.load_s)
                         for n, m in sorted(self._models.items())))
