"""State time-to-live in running jobs (``ctx.value_state(name,
ttl=ef.StateTtl(s))`` and the list, map and reducing kinds), once per state
backend, processing time from a clock the test drives (never a sleep):

* A process function keeps each kind with a TTL (mutable values: dicts and
  lists, a reducing accumulator merged in place) and yields what it reads
  before each write; a plain-Python model of the rule (``written_at +
  seconds <= now`` expires; writes stamp, reads do not) gives every output,
  the final ``JobResult.state`` (without write times, without what expired)
  and, for every checkpoint, the exact stored state at its barrier: nothing
  that had expired, everything that had not, with its write time.
* Restores at other parallelisms keep each entry's write time: entries
  written before a rescale expire when they would have without it.
* A TTL switched on or off across a restore is refused naming the operator
  and the states.
* With failures and restarts (restoring checkpoints) the output and the
  final state equal a failure-free run's.

The function sets the clock to each record's time (records come in time
order, one keyed subtask), so what a record sees does not depend on when
batches or barriers happen to fall.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from job_support import Pace, StateBackendFactory, watched
from test_snapshot_isolation import assert_same_state, reference_and_checked

import eddyflow as ef
from eddyflow.offline.checkpoint import keyed_files, open_checkpoint, read_keyed_file

TTL = ef.StateTtl(10.0)
TIMEOUT = 60.0
STATES = ("value", "map", "list", "acc")


def identity(r: Any) -> Any:
    return r


def records(n: int = 240, seed: int = 3) -> list[tuple[str, float, int]]:
    """``(key, time, i)`` in time order: keys from hot to rare (a rare key's
    state mostly expires between its records), steps of 0 to 2.5 s in
    quarters (so some reads fall exactly on an expiry time, and floats are
    exact)."""
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += rng.choice([0.0, 0.25, 0.5, 1.0, 2.5])
        out.append((rng.choices(["hot", "warm", "cold", "rare"], [8, 4, 2, 1])[0], t, i))
    return out


RECORDS = records()


def merge_in_place(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    a["n"] += b["n"]
    a["xs"].extend(b["xs"])
    return a


class Tracked(ef.KeyedProcessFunction):
    """Per record ``(key, t, i)``: the clock goes to ``t``; yields what it
    reads of its four states, then writes each. In place wherever a live
    value allows it: the value's dict is counted up and written back (a
    write: its time is renewed); map entry ``i % 3``'s list is appended to
    *without* a ``put`` (state all the same, but not a write: its time
    stays), or put anew once expired; a dict is added to the list;
    ``{"n": 1, "xs": [i]}`` is merged in place into the accumulator."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock  # one for the job: a clock's deepcopy is itself

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.value = ctx.value_state("value", ttl=TTL)
        self.map = ctx.map_state("map", ttl=TTL)
        self.list = ctx.list_state("list", ttl=TTL)
        self.acc = ctx.reducing_state("acc", merge_in_place, ttl=TTL)

    def process(self, value: tuple[str, float, int], ctx: ef.RuntimeContext) -> Iterator[Any]:
        key, t, i = value
        self.clock.set(t)
        # A copy: the accumulator is changed in place by later records.
        yield copy.deepcopy((key, t, i, self.value.value, sorted(self.map.items()),
                             self.list.get(), self.acc.get()))
        d = self.value.value
        if d is None:
            d = {"count": 0}
        d["count"] += 1
        d["i"] = i
        self.value.update(d)
        entry = self.map.get(i % 3)
        if entry is not None:
            entry.append(i)
        else:
            self.map.put(i % 3, [i])
        self.list.add({"i": i})
        self.acc.add({"n": 1, "xs": [i]})


class Model:
    """The same function in plain Python, the TTL rule written out:
    ``stored`` keeps every write with its time, whatever expired."""

    def __init__(self) -> None:
        self.stored: dict[str, dict[Any, Any]] = {name: {} for name in STATES}

    @staticmethod
    def live(at: float, now: float) -> bool:
        return not at + TTL.seconds <= now

    def step(self, r: tuple[str, float, int]) -> Any:
        key, t, i = r
        value, maps, lists, acc = (self.stored[n] for n in STATES)
        v = value.get(key)
        seen_v = v[1] if v is not None and self.live(v[0], t) else None
        m = {mk: x for mk, (at, x) in maps.get(key, {}).items() if self.live(at, t)}
        items = [x for at, x in lists.get(key, []) if self.live(at, t)]
        a = acc.get(key)
        seen_a = a[1] if a is not None and self.live(a[0], t) else None
        out = copy.deepcopy((key, t, i, seen_v, sorted(m.items()), items, seen_a))
        value[key] = (t, {"count": seen_v["count"] + 1 if seen_v else 1, "i": i})
        if i % 3 in m:
            m[i % 3].append(i)  # the stored list itself: its time stays
        else:
            maps.setdefault(key, {})[i % 3] = (t, [i])
        lists.setdefault(key, []).append((t, {"i": i}))
        acc[key] = (t, {"n": seen_a["n"] + 1, "xs": [*seen_a["xs"], i]} if seen_a
                    else {"n": 1, "xs": [i]})
        return out

    def at(self, now: float) -> dict[str, dict[Any, Any]]:
        """The stored state at ``now`` with what expired taken out."""
        live = self.live
        value, maps, lists, acc = (self.stored[n] for n in STATES)
        out: dict[str, dict[Any, Any]] = {
            "value": {k: v for k, v in value.items() if live(v[0], now)},
            "map": {k: {mk: e for mk, e in m.items() if live(e[0], now)} for k, m in maps.items()},
            "list": {k: [e for e in es if live(e[0], now)] for k, es in lists.items()},
            "acc": {k: v for k, v in acc.items() if live(v[0], now)},
        }
        return {name: {k: v for k, v in table.items() if v} for name, table in out.items()}

    def visible(self, now: float) -> dict[str, dict[Any, Any]]:
        """What user code reads at ``now``: no write times."""
        stored = self.at(now)
        return {
            "value": {k: v for k, (_, v) in stored["value"].items()},
            "map": {k: {mk: x for mk, (_, x) in m.items()} for k, m in stored["map"].items()},
            "list": {k: [x for _, x in es] for k, es in stored["list"].items()},
            "acc": {k: v for k, (_, v) in stored["acc"].items()},
        }


def tracked_job(env: ef.StreamEnvironment, sink: ef.Sink, failing: Callable[[Any], Any],
                pace: Callable[[Any], Any], clock: Any = None,
                records: list[tuple[str, float, int]] = RECORDS) -> None:
    clock = clock if clock is not None else RecordClock()
    env.set_clock(clock)
    ds = env.from_collection(records).name("src")
    ds = ds.map(pace).name("pace").set_parallelism(1)
    ds = ds.map(failing).name("failing").set_parallelism(1)
    (ds.key_by(lambda r: r[0]).process(Tracked(clock)).name("tracked").set_parallelism(1)
        .sink_to(sink).name("sink"))


def stored_state(info: ef.CheckpointInfo, operator: str) -> dict[str, dict[Any, Any]]:
    """What checkpoint ``info`` holds of ``operator``'s keyed state, as
    stored (write times and all), read with the offline readers."""
    out: dict[str, dict[Any, Any]] = {}
    for kf in keyed_files(open_checkpoint(info.path), operator):
        for _, name, key, value in read_keyed_file(kf):
            out.setdefault(name, {})[key] = value
    return out


@pytest.mark.parametrize("checkpoints", [False, True])
def test_every_kind_expires_as_the_model_says(checkpoints: bool, tmp_path: Path,
                                              state_backend: StateBackendFactory) -> None:
    model = Model()
    want = [model.step(r) for r in RECORDS]
    # Not vacuous: reads found expired values, and live ones, of each kind.
    assert any(o[3] is None for o in want[10:]) and any(o[3] is not None for o in want)
    assert any(0 < len(o[4]) < 3 for o in want) and any(o[6] and o[6]["n"] > 3 for o in want)
    assert any(len(xs) > 2 for o in want for _, xs in o[4])  # appended to in place
    assert any(o[3] and o[3]["count"] > 3 for o in want)

    env = ef.StreamEnvironment(parallelism=1, batch_size=8)
    state_backend.use(env, tmp_path)
    if checkpoints:
        env.enable_checkpointing(0.005, tmp_path / "chk", retained=1000)
    clock = ef.testing.ManualClock()
    sink = ef.ListSink()
    tracked_job(env, sink, identity, Pace(1, 0.005) if checkpoints else identity, clock)
    result = watched(env.execute_async("ttl"), TIMEOUT)

    assert sorted(sink.results, key=lambda o: o[2]) == want
    end = RECORDS[-1][1]
    assert clock.now() == end
    visible = model.visible(end)
    for name in STATES:
        assert dict(result.state("tracked", name).items()) == visible[name], name
    if not checkpoints:
        return
    # Every checkpoint holds exactly the state at its barrier: the records
    # before it (the source's position) written, and nothing that had
    # expired by the last one's time.
    infos = ef.list_checkpoints(tmp_path / "chk")
    positions = [int(i.operators["src"]["subtasks"]["0"]["source"]["slice-0"]) for i in infos]
    assert infos[-1].final and any(0 < p < len(RECORDS) for p in positions), positions
    for info in infos:
        position = int(info.operators["src"]["subtasks"]["0"]["source"]["slice-0"])
        at = Model()
        for r in RECORDS[:position]:
            at.step(r)
        now = RECORDS[position - 1][1] if position else 0.0
        got = stored_state(info, "tracked")
        assert {name: got.get(name, {}) for name in STATES} == at.at(now), info.id


# -- restores at other parallelisms ---------------------------------------------------


class Keeper(ef.KeyedProcessFunction):
    """Records ``(key, tag, op)``. ``"write"``: the value, a map entry and a
    list element named ``tag``, 1 added to a sum; ``"touch"``: the map
    entry and the list element only; ``"probe"``: yields what it reads."""

    def __init__(self, ttl: ef.StateTtl | None = TTL) -> None:
        self.ttl = ttl

    def open(self, ctx: ef.RuntimeContext) -> None:
        self.value = ctx.value_state("value", ttl=self.ttl)
        self.map = ctx.map_state("map", ttl=self.ttl)
        self.list = ctx.list_state("list", ttl=self.ttl)
        self.sum = ctx.reducing_state("sum", lambda a, b: a + b, ttl=self.ttl)

    def process(self, value: tuple[str, str, str], ctx: ef.RuntimeContext) -> Iterator[Any]:
        key, tag, op = value
        if op == "probe":
            yield (key, self.value.value, sorted(self.map.items()), self.list.get(),
                   self.sum.get())
            return
        if op == "write":
            self.value.update({"by": tag})
            self.sum.add(1)
        self.map.put(tag, [tag])
        self.list.add({"by": tag})


KEYS = [f"k{i}" for i in range(30)]


def keeper_run(tmp_path: Path, backend: StateBackendFactory, name: str, parallelism: int,
               now: float, records: list[Any], restore: str | None = None,
               ttl: ef.StateTtl | None = TTL) -> tuple[ef.JobResult, list[Any]]:
    """One run of a ``Keeper`` job at ``parallelism`` with the clock
    standing at ``now``, checkpointing into ``tmp_path / "chk"``; its
    source is named after the run (each run reads other records)."""
    env = ef.StreamEnvironment(parallelism=parallelism, batch_size=4)
    backend.use(env, tmp_path / name)
    env.enable_checkpointing(10.0, tmp_path / "chk", retained=100)
    env.set_clock(ef.testing.ManualClock(now))
    sink = ef.ListSink()
    (env.from_collection(records).name(f"src-{name}").set_parallelism(1)
        .key_by(lambda r: r[0]).process(Keeper(ttl)).name("keeper")
        .sink_to(sink).name("sink"))
    result = watched(env.execute_async(name, restore=restore, allow_non_restored_state=True),
                     TIMEOUT)
    return result, list(sink.results)


def test_rescaled_restores_keep_each_entrys_write_time(tmp_path: Path,
                                                       state_backend: StateBackendFactory
                                                       ) -> None:
    """Written at 0 at parallelism 2; at 5, restored at parallelism 3, half
    the keys rewritten, half only given a map entry and a list element
    more; then restored at parallelism 1 at 9.75 (nothing expired) and at
    parallelism 4 at 10 (what was written at 0 expired, nothing else)."""
    keeper_run(tmp_path, state_backend, "a", 2, 0.0, [(k, "a", "write") for k in KEYS])
    touched, rewritten = KEYS[:15], KEYS[15:]
    keeper_run(tmp_path, state_backend, "b", 3, 5.0,
               [(k, "b", "touch") for k in touched] + [(k, "b", "write") for k in rewritten],
               restore="latest")
    after_b = ef.list_checkpoints(tmp_path / "chk")[-1]
    probes = [(k, "-", "probe") for k in KEYS]

    _, before = keeper_run(tmp_path, state_backend, "c", 1, 9.75, probes, restore=after_b.path)
    both = [("a", ["a"]), ("b", ["b"])]
    elements = [{"by": "a"}, {"by": "b"}]
    assert sorted(before) == sorted(
        [(k, {"by": "a"}, both, elements, 1) for k in touched]
        + [(k, {"by": "b"}, both, elements, 2) for k in rewritten])

    result, after = keeper_run(tmp_path, state_backend, "d", 4, 10.0, probes,
                               restore=after_b.path)
    assert sorted(after) == sorted(
        [(k, None, [("b", ["b"])], [{"by": "b"}], None) for k in touched]
        + [(k, {"by": "b"}, [("b", ["b"])], [{"by": "b"}], 2) for k in rewritten])
    assert dict(result.state("keeper", "sum").items()) == dict.fromkeys(rewritten, 2)
    # The run's final checkpoint (at 10) holds nothing written at 0.
    got = stored_state(ef.list_checkpoints(tmp_path / "chk")[-1], "keeper")
    assert set(got["value"]) == set(got["sum"]) == set(rewritten)
    assert {v[0] for v in got["value"].values()} == {5.0}
    assert all(set(m) == {"b"} for m in got["map"].values()) and len(got["map"]) == 30
    assert all(es == [(5.0, {"by": "b"})] for es in got["list"].values())


@pytest.mark.parametrize(("before", "after"), [(None, TTL), (TTL, None)])
def test_a_ttl_switched_on_or_off_is_refused_naming_the_states(
        before: ef.StateTtl | None, after: ef.StateTtl | None, tmp_path: Path,
        state_backend: StateBackendFactory) -> None:
    keeper_run(tmp_path, state_backend, "a", 2, 0.0, [(k, "a", "write") for k in KEYS],
               ttl=before)
    with pytest.raises(ef.JobFailed) as info:
        keeper_run(tmp_path, state_backend, "b", 2, 1.0, [("k0", "b", "probe")],
                   restore="latest", ttl=after)
    cause = info.value.__cause__
    assert isinstance(cause, ef.IncompatibleCheckpoint), repr(cause)
    message = str(cause)
    assert message.startswith("cannot restore operator 'keeper': ")
    if before is None:
        assert ("the checkpoint holds its state 'value' (value state) without a time-to-live, "
                "the job declares it with StateTtl(10.0)") in message
    else:
        assert ("the checkpoint holds its state 'map' (map state) with a time-to-live, the job "
                "declares it without one") in message
    assert all(f"state '{name}'" in message for name in ("value", "map", "list", "sum"))
    assert "cannot gain or lose its time-to-live across a restore" in message
    assert len(cause.problems) == 4


def test_a_changed_ttl_duration_restores(tmp_path: Path,
                                         state_backend: StateBackendFactory) -> None:
    keeper_run(tmp_path, state_backend, "a", 2, 0.0, [(k, "a", "write") for k in KEYS[:3]])
    _, seen = keeper_run(tmp_path, state_backend, "b", 3, 15.0,
                         [(k, "-", "probe") for k in KEYS[:3]], restore="latest",
                         ttl=ef.StateTtl(20.0))
    assert sorted(seen) == [(k, {"by": "a"}, [("a", ["a"])], [{"by": "a"}], 1)
                            for k in KEYS[:3]]


# -- failures ----------------------------------------------------------------------------


class RecordClock:
    """Processing time is the time of the record being processed: the
    function sets it (``set``) from each record, also when a restart
    replays records from an earlier position (it may go back, unlike a
    ``ManualClock``). So the reference run and a run with restarts see the
    same time at every record. No timers here: nothing is ever called."""

    def __init__(self) -> None:
        self.at = 0.0
        self._calls = ef.testing.ManualClock()

    def now(self) -> float:
        return self.at

    def set(self, t: float) -> None:
        self.at = t

    def call_at(self, when: float, callback: Callable[[], None]) -> Any:
        return self._calls.call_at(when, callback)

    def __deepcopy__(self, memo: dict[int, Any]) -> RecordClock:
        return self


LONG = records(1200, seed=5)


def long_tracked_job(env: ef.StreamEnvironment, sink: ef.Sink, failing: Callable[[Any], Any],
                     pace: Callable[[Any], Any]) -> None:
    tracked_job(env, sink, failing, pace, records=LONG)


@pytest.mark.parametrize("after", [100, 170])
def test_failures_and_restarts_give_the_failure_free_result(
        after: int, tmp_path: Path, state_backend: StateBackendFactory) -> None:
    """Up to three failures, each after one more checkpoint completed (see
    ``test_snapshot_isolation``): every restart restores a checkpoint whose
    expired entries were dropped at its barrier and replays the records
    after it; the function's reads, and so the output, and the final state
    are the failure-free run's, which the model checks in turn."""
    runs = reference_and_checked(long_tracked_job, tmp_path, state_backend, after=after)
    model = Model()
    want = [model.step(r) for r in LONG]
    assert sorted(runs.reference_output, key=lambda o: o[2]) == want
    # Exactly once (outputs hold dicts: compared in order of their record,
    # each record's once).
    assert sorted(runs.checked_output, key=lambda o: o[2]) == want
    for name in STATES:
        assert_same_state(runs, "tracked", name)

