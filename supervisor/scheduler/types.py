"""Values the scheduler's decision core works with: engines, jobs, policy, effects."""

from __future__ import annotations

import collections
import enum
import math

import attrs

from supervisor.address import Address
from supervisor.request_class import RequestClass

GIB = 1024**3
# Where a process steward does not place runs (CUDA's first device): an exclusive job
# (ComfyUI's image job), a service's kept process unless models.NAME.devices says.
DEFAULT_DEVICE = 0


class GpuMode(enum.StrEnum):
    """What the GPU does now, by the highest class at work (the `mode` event, /healthz)."""

    EXCLUSIVE = "exclusive"
    INTERACTIVE = "interactive"
    BACKGROUND = "background"
    BATCH = "batch"
    IDLE = "idle"


class EngineStatus(enum.StrEnum):
    """Where an engine is in its life; its value is what snapshots and events say."""

    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    # Ready, but chosen for eviction (or an exclusive job): no new work, stopped once idle.
    DRAINING = "draining"
    STOPPING = "stopping"
    # Unloaded but its process kept (vLLM's /sleep): it holds its sleeping memory, and the
    # next demand wakes it, which is a load of the difference.
    SLEEPING = "sleeping"
    FAILED = "failed"  # exited unexpectedly; may start again at retry_at


class WarmCause(enum.Enum):
    """Why the core loads engines ahead of demand now (core.py, rule 10): what freed the GPU."""

    EXCLUSIVE_JOB = "exclusive_job"
    IDLE_UNLOAD = "idle_unload"

    @property
    def words(self) -> str:
        return "after an image job" if self is WarmCause.EXCLUSIVE_JOB else "after an idle unload"


class EngineAction(enum.Enum):
    """What an admin may ask of an engine (POST /admin/engines/NAME/ACTION)."""

    LOAD = "load"
    UNLOAD = "unload"
    PIN = "pin"
    UNPIN = "unpin"


@attrs.frozen
class Retirement:
    replacement: EngineProfile | None  # None: removed from the config
    announced: bool = False  # RetireEngine was said: the engine task is going (or gone)


class FallbackWhen(enum.Enum):
    """What sends a waiting request to a model of its model's fallback chain (fallback.py)."""

    NO_ROOM = "no_room"  # its model cannot be loaded without evicting what its class may not evict
    WAIT = "wait"  # its predicted wait passes the class's slo_wait (or the route's own bound)
    FAILED = "failed"  # its model's engine failed to start or crashed, and waits for its backoff


@attrs.frozen
class FallbackRoute:
    """One entry of a model's fallback chain (models.NAME.fallback), tried in order."""

    model: str
    when: frozenset[FallbackWhen]
    classes: frozenset[RequestClass] | None = None  # None: every class
    wait: float | None = None  # the bound for `wait`; None: the class's slo_wait
    # Its model is a cloud's (runtime: remote): never loaded, never out of room; the request
    # leaves the scheduler for it (a Grant with ``remote``), and waits for its places at the gateway.
    remote: bool = False

    def serves(self, klass: RequestClass) -> bool:
        return self.classes is None or klass in self.classes


@attrs.frozen
class EngineProfile:
    """What the core needs to know of an engine: its size, its slots, its tier."""

    name: str
    memory: int
    slots: int
    pinned: bool = False
    # Set by hand: a measurement is reported but does not replace it.
    fixed_memory: bool = False
    # Stopped (or put to sleep) after this long without a request; None: never.
    idle_unload: float | None = None
    # What it holds asleep, set by hand; None: measured once it sleeps (the full reservation until then).
    sleep_memory: int | None = None
    # The devices it may use (models.NAME.devices); None: any. Several: it is split over them.
    devices: tuple[int, ...] | None = None
    # Whether its runtime splits one model over several devices (llama-server's --tensor-split),
    # which it is when no single device can hold it.
    splittable: bool = False
    # Where its waiting requests may go instead (models.NAME.fallback), in order.
    fallback: tuple[FallbackRoute, ...] = ()


@attrs.frozen
class Placement:
    """Where a load's memory goes: bytes on each of the host's devices (index = device)."""

    shares: tuple[int, ...]

    @classmethod
    def of(cls, share: dict[int, int], device_count: int) -> Placement:
        return cls(tuple(share.get(device, 0) for device in range(device_count)))

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(device for device, nbytes in enumerate(self.shares) if nbytes)

    @property
    def share(self) -> dict[int, int]:
        return {device: nbytes for device, nbytes in enumerate(self.shares) if nbytes}

    @property
    def split(self) -> bool:
        return len(self.devices) > 1

    @property
    def chosen(self) -> bool:
        """Whether there was a choice to make: the host has several devices."""
        return len(self.shares) > 1


@attrs.frozen
class HotKept:
    """The hot time an engine had left when it was evicted for exclusive job *job*: an image job
    pauses its hot_window's clock, so the chat model comes back as hot as it left."""

    job: int
    left: float  # seconds of hot_window left when its eviction was decided


@attrs.define
class EngineState:
    profile: EngineProfile
    status: EngineStatus = EngineStatus.STOPPED
    generation: int = 0  # bumped by every start; stale reports carry an old one
    endpoint: Address | None = None
    pid: int | None = None
    # Its kept service's process (a sleep-capable vLLM), told at each spawn: it runs, and holds
    # memory, before the engine is first loaded and after a failed start. That memory is the
    # engine's, not outside use: reserved for it while it is not loaded (memory.py).
    kept_pid: int | None = None
    in_flight: int = 0  # steps of the current generation granted and not finished
    last_used: float = -math.inf
    last_interactive: float = -math.inf  # residency: hot while this is within hot_window
    failures: int = 0  # consecutive unexpected exits
    retry_at: float = -math.inf
    start_decided_at: float = 0.0
    ready_at: float | None = None
    # Memory used outside engines when its stop began: what the device must be back to once
    # it exited (its reservation is the ledger's, held until then: Ledger.awaiting_free).
    outside_baseline: tuple[int, ...] | None = None  # per device
    measured: int = 0  # the most this generation's process has been seen to use
    # What a service says it holds (Ollama's /api/ps): its processes are not ours to name,
    # so this much of the device's unattributed memory is its, not outside use.
    external: int = 0
    # Health checks of a ready engine: failed ones in a row, and since when it counts as
    # unhealthy (no new work; restarted once recover_timeout has passed).
    check_failures: int = 0
    unhealthy_since: float | None = None
    restarting_unhealthy: bool = False  # the stop under way is a restart: its exit is a failure
    # What the engine says of its own queue (vLLM's metrics) and KV cache (vLLM's, llama-server's
    # /slots), for /healthz and /metrics.
    reported_running: int | None = None
    reported_waiting: int | None = None
    reported_kv_usage: float | None = None
    # Where its current (or last) load was placed: a wake stays there, a new load prefers it.
    placement: Placement | None = None
    # An admin asked for it to be loaded (POST /admin/engines/NAME/load): loaded once the idle
    # cold engines evicted for it are gone, as if a request waited for it.
    requested: bool = False
    # A reload removes it or changes it: it takes no new work, drains, stops, and then its
    # engine task is retired (a changed one gets a new task, and this profile).
    retiring: Retirement | None = None
    # What its drain was decided for, while it drains: an exclusive job (its id) or the load of
    # another engine (its name). Once that no longer wants the memory (the job left or timed
    # out, nobody waits for that engine), the drain is undone: it must not unload for no one.
    drained_for: int | str | None = None
    # Its last load's time from the decision to ready (a wake's is not one), kept in the state
    # file; None: never measured. What evicting it costs (ReloadCost).
    load_s: float | None = None
    # Its last eviction's save of its slots' caches (keep_cache), after the drain and before the
    # stop: the load that evicts it waits that long too. 0: none (or never measured).
    save_s: float = 0.0
    waking: bool = False  # the start under way is a wake of its kept process
    # (when, weight) of the steps started on it within hot_window, and their weights' sum.
    uses: collections.deque[tuple[float, float]] = attrs.Factory(collections.deque)
    used_weight: float = 0.0
    # The generation of its last warm load (core.py, rule 10): while that start is under way it
    # is batch work, stopped if real demand needs its memory. None: never warmed.
    warm_generation: int | None = None
    # When it was last stopped for being idle (idle_unload): not warmed until it is used again.
    idle_unloaded_at: float | None = None
    # Evicted while hot for an exclusive job: the hot time it had left, given back when the job
    # ends (exclusive.py); then True until its next warm load, which keeps that hot time.
    hot_kept: HotKept | None = None
    hot_resumed: bool = False

    @property
    def unhealthy(self) -> bool:
        return self.unhealthy_since is not None

    @property
    def name(self) -> str:
        return self.profile.name

    def stop_serving(self) -> None:
        """What a load leaves behind once its process is gone or asleep: no endpoint, nothing
        in flight, nothing it said of itself, no health record."""
        self.endpoint = None
        self.in_flight = 0
        self.external = 0
        self.check_failures = 0
        self.unhealthy_since = None
        self.restarting_unhealthy = False
        self.reported_running = self.reported_waiting = self.reported_kv_usage = None

    @property
    def warming(self) -> bool:
        """Its start under way is a warm load: nobody asked for it."""
        return self.status is EngineStatus.STARTING and self.warm_generation == self.generation

    @property
    def unused_warm(self) -> bool:
        """Loaded (or loading) by a warm load, and no step has started on it since: nobody asked for it."""
        return (self.warm_generation == self.generation
                and self.status in (EngineStatus.STARTING, EngineStatus.READY, EngineStatus.DRAINING)
                and (not self.uses or self.uses[-1][0] < self.start_decided_at))

    @property
    def idle_since_unload(self) -> bool:
        """Stopped for being idle, and not used since: its idle_unload says it is not wanted idle."""
        return self.idle_unloaded_at is not None and self.idle_unloaded_at >= self.last_used

    @property
    def draining(self) -> bool:
        """On its way out: no new work (draining its steps, or stopping)."""
        return self.status in (EngineStatus.DRAINING, EngineStatus.STOPPING)

    @property
    def serving(self) -> bool:
        """Its process serves the steps already granted to it (ready, or draining them)."""
        return self.status in (EngineStatus.READY, EngineStatus.DRAINING)

    def hot(self, now: float, window: float) -> bool:
        return now - self.last_interactive < window

    def record_use(self, now: float, klass: RequestClass | str, window: float) -> None:
        weight = RequestClass(klass).use_weight
        self.uses.append((now, weight))
        self.used_weight += weight
        self.recent_uses(now, window)

    def recent_uses(self, now: float, window: float) -> float:
        """The steps started on it within *window* before *now*, each by its class's weight."""
        # The weights are binary fractions: adding and taking them away again is exact.
        while self.uses and now - self.uses[0][0] >= window:
            self.used_weight -= self.uses.popleft()[1]
        return self.used_weight

    def reload_cost(self, now: float, window: float, *, queued: bool) -> ReloadCost:
        measured = self.load_s is not None
        load_s = self.load_s if self.load_s is not None else unmeasured_load_s(self.profile.memory)
        return ReloadCost(load_s, measured, self.recent_uses(now, window), queued, self.unused_warm,
                          save_s=self.save_s)


def unmeasured_load_s(memory: int) -> float:
    """A load not yet measured: 1 s to start, 1 s per GiB read (a model on a local SSD)."""
    return 1.0 + memory / GIB


@attrs.frozen
class ReloadCost:
    """What evicting an engine is expected to cost: the time to load it again, times how
    likely it is to be needed soon. Requests queued for it: certain. Else, if steps keep
    coming at the rate of the last hot_window, the chance of one within the next:
    1 - exp(-recent_uses). An engine unused for hot_window costs nothing."""

    load_s: float
    measured: bool  # load_s was measured (else estimated from its size)
    recent_uses: float  # steps started within hot_window, by class weight (RequestClass.use_weight)
    queued: bool  # requests for it wait (of later demand: earlier demand may not evict it)
    # Loaded ahead of demand and unused since: evicting it costs what not warming it would
    # have, nothing (else a warm load could hold a request that its memory would have served).
    unused_warm: bool = False
    # A busy victim is drained first: how long its running steps are expected to take yet
    # (its measured mean step less what each has run); None: busy, steps never measured.
    drain_s: float | None = 0.0
    # Its slots' caches are saved before it stops (keep_cache): the last save's measured time,
    # waited for now like the drain (the restore is part of its next load's load_s).
    save_s: float = 0.0

    @property
    def likely(self) -> float:
        if self.queued:
            return 1.0
        return 0.0 if self.unused_warm else 1.0 - math.exp(-self.recent_uses)

    @property
    def cost(self) -> float:
        """The load waits for the drain now, and someone waits for the reload later (an unknown
        drain counts 0 here: the victims' order puts it after every known one)."""
        return (self.drain_s or 0.0) + self.save_s + self.load_s * self.likely

    def fields(self) -> dict[str, object]:
        """For the `evict` event: the figures it was chosen by."""
        return {"load_s": round(self.load_s, 3), "load_measured": self.measured,
                "recent_uses": self.recent_uses, "likely": round(self.likely, 3), "cost": round(self.cost, 3),
                "unused_warm": self.unused_warm,
                "drain_s": None if self.drain_s is None else round(self.drain_s, 3), "save_s": round(self.save_s, 3)}


@attrs.define
class Job:
    """One step of a request. A chat is one step; an embeddings request one per chunk."""

    id: int
    model: str | None  # None: an exclusive job, which needs the GPU rather than an engine
    klass: RequestClass
    seq: int  # the request's place in line; every step of a request keeps it (FIFO by arrival)
    submitted: float
    deadline: float
    request: int = 0
    step: int = 1
    steps: int = 1
    exclusive_memory: int = 0
    engine_generation: int | None = None  # set when granted
    dispatched: float | None = None
    by_guard: bool = False  # started by the starvation guard, beside higher-class work
    next_report: float = math.inf  # when its wait is next said in a `waiting` event, if still waiting
    # Held for a swap (swap_hold) until then: said once, in a `swap_held` event.
    held_until: float | None = None
    # The models its caller may use (its key's list, aliases resolved); None: any. A fallback
    # never goes outside it.
    may_use: frozenset[str] | None = None
    fallback_from: str | None = None  # the model it asked for, once it went to a fallback (never twice)

    @property
    def exclusive(self) -> bool:
        return self.model is None


@attrs.frozen
class GuardClaim:
    """A due guard turn that waits for the lower classes' own steps (core.py, rule 4b): no
    other background or batch step starts on these engines until it has started."""

    klass: RequestClass
    engines: tuple[str, ...]


@attrs.frozen
class BackoffPolicy:
    initial: float = 1.0
    maximum: float = 60.0

    def delay(self, failures: int) -> float:
        return min(self.initial * 2 ** max(failures - 1, 0), self.maximum)


def _per_class(values: dict[str, float]) -> dict[RequestClass, float]:
    return {klass: values[klass] for klass in RequestClass}


@attrs.frozen
class SchedulingPolicy:
    """The rules' knobs; everything here comes from the config (DESIGN.md, hard rules)."""

    interactive_window: float = 2.0
    # How long the head of a lower class may go without progress before one of its steps
    # runs beside higher-class work; 0 turns the guard off (full exclusivity).
    starvation: dict[RequestClass, float] = attrs.field(
        factory=lambda: {"interactive": 0.0, "background": 3.0, "batch": 10.0}, converter=_per_class)
    # Beside interactive work, lower classes share one lane (one step at a time), used at
    # most this fraction of the time: after a guard step of d seconds, the next may start
    # d * (1 - share) / share later. 1.0: as often as the starvation clock allows.
    guard_share: float = 0.5
    # A due guard step waits up to this long for a moment when no interactive step is
    # computing (so no chat is slowed from its start), then goes anyway. 0: at once.
    guard_gap_wait: float = 15.0
    # A guard turn that starts while no interactive step computes also starts its class's next
    # steps for the same engine, up to its free slots (they batch); False: one step a turn.
    guard_fill: bool = False
    # In a gap between interactive steps (none computes or waits, the window still open), a
    # lower-class step on an engine whose last steps took at most this long on average starts
    # at once, outside the guard's lane and share; 0: off (core.py, rule 3b).
    gap_step: float = 0.0
    # While an engine is hot, background and batch steps compute on at most this many engines
    # at once (core.py, rule 3c); 0: no limit.
    lower_class_engines: int = 1
    hot_window: float = 300.0
    # Within a class, a load that would evict another engine waits up to this long after its
    # request arrived while the class's other work keeps loaded engines busy (config's
    # scheduler.swap_hold explains the default); 0: strict arrival order.
    swap_hold: float = 10.0
    # Engines to load ahead of demand after an exclusive job or an idle unload, first first,
    # before those used lately (config's scheduler.warm; core.py, rule 10).
    warm: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    max_queue: dict[RequestClass, float] = attrs.field(
        factory=lambda: {"interactive": 1000, "background": 10_000, "batch": 100_000}, converter=_per_class)
    queue_timeout: dict[RequestClass, float] = attrs.field(
        factory=lambda: {"interactive": 60.0, "background": 600.0, "batch": 3600.0}, converter=_per_class)
    # How long a class's request should wait at most (classes.C.slo_wait): /healthz's bound, and
    # the `wait` of a fallback route that sets none.
    slo_wait: dict[RequestClass, float] = attrs.field(
        factory=lambda: {"interactive": 30.0, "background": 300.0, "batch": 1800.0}, converter=_per_class)
    # After an engine exits, how long to wait for its memory to be observed free.
    release_timeout: float = 10.0
    # How much memory not attributed to any process may remain after an exit and still count as freed.
    release_tolerance: int = 64 * 1024**2
    # Readings after the last engine stopped during which the outside estimate stays
    # frozen: NVML's totals and its process list are separate calls (research: phantom memory).
    settle_polls: int = 2
    backoff: BackoffPolicy = attrs.Factory(BackoffPolicy)
    # A request waiting this long is said, with why, in a `waiting` event; then again at twice
    # the wait, and so on.
    wait_report_after: float = 5.0
    # Failed health checks in a row that make a ready engine unhealthy, and how long it may
    # stay so before it is restarted.
    unhealthy_after: int = 3
    recover_timeout: float = 30.0


# Effects: what the async shell must do after a decision.
@attrs.frozen
class Grant:
    job_id: int
    engine: str | None  # None for an exclusive job: the GPU is all its own
    endpoint: Address | None
    generation: int = attrs.field(default=0, eq=False)  # of the engine's process the step runs on
    # How long it waited on the scheduler's clock: 0.0 exactly when granted as it was taken. The
    # one "waited" steward has: the dispatch event's, /healthz's share, the usage log's queued_s.
    waited_s: float = attrs.field(default=0.0, eq=False)
    # The request went to a fallback a cloud serves (*engine* names that remote model): it holds
    # no slot here, and the gateway relays it to the cloud.
    remote: bool = False


@attrs.frozen
class Fail:
    job_id: int
    status: int
    code: str
    message: str
    retry_after: float | None = None


@attrs.frozen
class StartEngine:
    engine: str
    generation: int
    placement: Placement | None = attrs.field(default=None, eq=False)  # where its process is to put its memory


@attrs.frozen
class StopEngine:
    engine: str
    generation: int


@attrs.frozen
class Revoke:
    """End a granted step early: its engine stopped answering."""

    job_id: int
    reason: str


@attrs.frozen
class CheckEngine:
    """Check the engine's health now (a request on it stalled)."""

    engine: str
    generation: int


@attrs.frozen
class RetireEngine:
    """End the engine's task (its process is gone): a reload removed or changed it."""

    engine: str
    replaced: bool


@attrs.frozen
class Measured:
    """An engine's memory as measured; replaces the estimate for its model and arguments."""

    engine: str
    nbytes: int


@attrs.frozen
class Emit:
    event: str
    level: str
    fields: dict[str, object]


Effect = Grant | Fail | StartEngine | StopEngine | Revoke | CheckEngine | Measured | RetireEngine | Emit


@attrs.frozen
class DeviceUse:
    """One device's reading: its total use, and the per-process list (pid -> bytes)."""

    used: int
    processes: dict[int, int]


@attrs.frozen
class EngineSnapshot:
    name: str
    status: EngineStatus
    in_flight: int
    slots: int
    memory: int
    reserved: int
    draining: bool
    pinned: bool
    hot: bool
    queued: int
    failures: int
    healthy: bool = True
    measured: int = 0  # the most its process tree was seen to hold, this load
    engine_running: int | None = None  # as the engine itself reports (vLLM's metrics)
    engine_waiting: int | None = None
    engine_kv_usage: float | None = None  # its KV cache's use, 0..1, as it says (vLLM's metrics, llama-server's /slots)
    devices: tuple[int, ...] = ()  # where its memory is reserved (or was, last time it loaded)
    held: dict[int, int] = attrs.field(factory=dict)  # device -> bytes reserved for it now
    generation: int = 0  # its loads so far
    last_used: float = -math.inf  # when a step of it last started or ended (the core's clock)
    hot_until: float | None = None  # while hot: when it stops being hot (the core's clock)


@attrs.frozen
class DeviceSnapshot:
    index: int
    budget: int
    reserved: int
    outside: int

    @property
    def free(self) -> int:
        return self.budget - self.reserved - self.outside


@attrs.frozen
class LineSnapshot:
    """The steps of one class waiting for one engine (engine None: exclusive jobs)."""

    engine: str | None
    klass: RequestClass
    waiting: int
    head_submitted: float  # when the step at its head was queued (trio's clock)
    reason: str = ""  # why its head waits (supervisor.scheduler.explain.WaitReason)
    why: str = ""  # the same, in words


@attrs.frozen
class SchedulerSnapshot:
    budget: int
    reserved: int
    outside: int  # memory used by processes that are not engines (frozen while engines stop)
    mode: GpuMode
    queued: int
    queued_by_class: dict[RequestClass, int]
    running_by_class: dict[RequestClass, int]
    engines: tuple[EngineSnapshot, ...]
    releasing: int  # engines whose memory is awaited free
    exclusive_waiting: int = 0  # exclusive jobs (whole-GPU, e.g. images) waiting
    lines: tuple[LineSnapshot, ...] = ()  # every queue: per class and engine, exclusive jobs included
    devices: tuple[DeviceSnapshot, ...] = ()

    def oldest_waiting(self, klass: RequestClass) -> float | None:
        """When the longest-waiting head of *klass* was queued, or None if none waits."""
        return min((line.head_submitted for line in self.lines if line.klass == klass), default=None)
