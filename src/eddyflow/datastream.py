"""The DataStream API: ``DataStream`` and ``KeyedStream``.

A stream is a handle on the outputs of one or more operators together with
how the next operator reads them (its partitioning); every transformation
adds a node to the environment's logical graph and returns a new handle.
``union`` merges handles and ``rebalance``/``broadcast``/``key_by`` change the
partitioning, so none of them adds an operator of its own.
"""

from __future__ import annotations

import operator
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, overload

from eddyflow.connected import BroadcastStream, ConnectedStreams, IntervalJoin, JoinedStreams, Side
from eddyflow.connectors.sink import PrintSink, Sink
from eddyflow.functions import KeyedProcessFunction
from eddyflow.graph.logical import Node, Partitioning
from eddyflow.runtime.operators.async_calls import MapAsyncSpec
from eddyflow.runtime.operators.io import SinkSpec
from eddyflow.runtime.operators.keyed import (
    KeyedCountSpec,
    KeyedReduceSpec,
    KeyedSpec,
    KeyedSumSpec,
    MapWithStateSpec,
)
from eddyflow.runtime.operators.process import KeyedProcessSpec
from eddyflow.runtime.operators.side_outputs import MainOutputSpec, SideOutputSpec
from eddyflow.runtime.operators.stateless import FilterSpec, FlatMapSpec, IterationHeadSpec, MapSpec
from eddyflow.runtime.operators.timestamps import AssignTimestampsSpec
from eddyflow.runtime.operators.windows import WindowSpec
from eddyflow.windowing.functions import (
    AggregateAdapter,
    AggregateFunction,
    CountAdapter,
    ProcessAdapter,
    ProcessWindowFunction,
    ReduceAdapter,
    SumAdapter,
    WindowAdapter,
    check_window_function,
)
from eddyflow.windowing.lifecycle import check_allowed_lateness
from eddyflow.windowing.watermarks import WatermarkStrategy
from eddyflow.windowing.windows import OutputTag, WindowAssigner

if TYPE_CHECKING:
    from eddyflow.environment import StreamEnvironment

__all__ = ["DataStream", "IterativeStream", "KeyedStream", "WindowedDataStream", "WindowedStream"]

_Input = tuple[int, Partitioning, Callable[[Any], Any] | None]


def _second(record: Any) -> Any:
    return record[1]


def _check_callable(fn: Any, what: str, where: str) -> None:
    if not callable(fn):
        raise TypeError(f"{where}: {what} must be callable, got {fn!r:.100}")


def _reads(inputs: tuple[_Input, ...]) -> list[tuple[int, Partitioning]]:
    """What an operator reading ``inputs`` reads: node ids and partitioning."""
    return [(source, part) for source, part, _ in inputs]


def _add_operator(env: StreamEnvironment, inputs: tuple[_Input, ...], kind: str, payload: Any,
                  *, detail: str = "", is_sink: bool = False) -> Node:
    """Add an operator reading ``inputs`` to ``env``'s graph, with its edges.
    The node is keyed iff its spec is (``KeyedSpec``, the one source)."""
    graph = env.graph
    node = graph.add_node(kind, payload, inputs=_reads(inputs), detail=detail,
                          keyed=isinstance(payload, KeyedSpec), is_sink=is_sink)
    for source, part, key_fn in inputs:
        graph.add_edge(source, node.id, part, key_fn)
    return node


class DataStream:
    """A stream of records: the outputs of one or more operators, and how the
    next operator reads them (see the module docstring)."""

    def __init__(
        self, env: StreamEnvironment, inputs: tuple[_Input, ...], node: Node | None = None
    ) -> None:
        self._env = env
        self._inputs = inputs
        self._node = node

    # -- adding operators --------------------------------------------------

    def _next_uid(self, kind: str, detail: str = "") -> str:
        """The uid the next operator of ``kind`` gets unless it is named (for
        the messages of checks made before it is added)."""
        return self._env.graph.generated_uid(kind, _reads(self._inputs), detail)[0]

    def _add(self, kind: str, payload: Any, *, detail: str = "",
             is_sink: bool = False) -> Node:
        return _add_operator(self._env, self._inputs, kind, payload, detail=detail,
                             is_sink=is_sink)

    def _inputs_of(self, other: DataStream) -> tuple[_Input, ...] | None:
        """What reads ``other`` if it is a stream of this job (``None`` if
        not): for ``union`` and a loop's ``close_with``."""
        return other._inputs if other._env is self._env else None

    def _then(self, kind: str, make: Callable[[str], Any], **attrs: Any) -> DataStream:
        node = self._add(kind, make(self._next_uid(kind)), **attrs)
        return DataStream(self._env, ((node.id, Partitioning.DEFAULT, None),), node)

    def map(self, fn: Callable[[Any], Any]) -> DataStream:
        """``fn(record)`` per record."""
        def make(uid: str) -> MapSpec:
            _check_callable(fn, "map function", f"operator '{uid}'")
            return MapSpec(fn)
        return self._then("map", make)

    def flat_map(self, fn: Callable[[Any], Iterable[Any]]) -> DataStream:
        """Every item of ``fn(record)`` per record (none, one or many)."""
        def make(uid: str) -> FlatMapSpec:
            _check_callable(fn, "flat_map function", f"operator '{uid}'")
            return FlatMapSpec(fn)
        return self._then("flat_map", make)

    def filter(self, pred: Callable[[Any], Any]) -> DataStream:
        """The records for which ``pred(record)`` is true."""
        def make(uid: str) -> FilterSpec:
            _check_callable(pred, "filter predicate", f"operator '{uid}'")
            return FilterSpec(pred)
        return self._then("filter", make)

    def map_async(self, fn: Callable[[Any], Awaitable[Any]], *, capacity: int = 100,
                  timeout: float = 10.0, ordered: bool = True) -> DataStream:
        """``await fn(record)`` per record, with up to ``capacity`` calls in
        flight per subtask on the job's event loop (enrichment from a
        service or a database; after Flink's async I/O).

        ``ordered=True`` emits results in input order; ``ordered=False`` as
        they complete, but never across a watermark (nor a checkpoint
        barrier). Records whose calls are in flight at a barrier are part of
        the checkpoint and are called again after a restore, at any
        parallelism: state and sinks stay exactly-once, the calls are
        at-least-once. A call that raises, or takes longer than ``timeout``
        seconds, fails the job, naming the operator and the record (the
        restart strategy applies). At capacity the operator reads no more
        input, which back-pressures upstream. ``fn`` should not change its
        record in place: the checkpoint keeps a copy to call it again with.
        See docs/concepts/async.md."""
        def make(uid: str) -> MapAsyncSpec:
            where = f"operator '{uid}'"
            _check_callable(fn, "map_async function", where)
            if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
                raise ValueError(f"{where}: map_async capacity must be an int >= 1, "
                                 f"got {capacity!r}")
            if (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                    or not timeout > 0 or timeout == float("inf")):
                raise ValueError(f"{where}: map_async timeout must be a number of seconds > 0, "
                                 f"got {timeout!r}")
            if not isinstance(ordered, bool):
                raise TypeError(f"{where}: map_async ordered must be a bool, got {ordered!r}")
            return MapAsyncSpec(fn, capacity, float(timeout), ordered)
        node = self._add("map_async", make(self._next_uid("map_async")))
        node.chain_head = True  # its task waits on its calls (runtime/calls.py)
        return DataStream(self._env, ((node.id, Partitioning.DEFAULT, None),), node)

    # -- partitioning ------------------------------------------------------

    def key_by(self, key: Callable[[Any], Any] | int | str) -> KeyedStream:
        """Partition by key: a function of the record, an ``int`` position in
        a tuple/list record, or a ``str`` field of a dict record."""
        if isinstance(key, bool) or not (callable(key) or isinstance(key, int | str)):
            raise TypeError(
                f"key_by after '{self._describe()}': key must be a callable, an int position "
                f"or a str field, got {key!r:.100}"
            )
        key_fn: Callable[[Any], Any]
        if isinstance(key, int):
            if key < 0:
                raise ValueError(
                    f"key_by after '{self._describe()}': position must be >= 0, got {key}"
                )
            key_fn = operator.itemgetter(key)
        elif isinstance(key, str):
            key_fn = operator.itemgetter(key)
        else:
            key_fn = key
        return KeyedStream(
            self._env,
            tuple((src, Partitioning.KEY_GROUP, key_fn) for src, _, _ in self._inputs),
            key_fn,
        )

    def rebalance(self) -> DataStream:
        """Spread the records round-robin over the next operator's subtasks."""
        return DataStream(self._env, tuple((s, Partitioning.REBALANCE, None)
                                           for s, _, _ in self._inputs))

    @overload
    def broadcast(self) -> DataStream: ...

    @overload
    def broadcast(self, name: str) -> BroadcastStream: ...

    def broadcast(self, name: str | None = None) -> DataStream | BroadcastStream:
        """Every record to every subtask of the next operator; with ``name``,
        a ``BroadcastStream`` carrying the broadcast state ``name`` (connect
        a stream to it: ``events.connect(rules.broadcast("rules"))``)."""
        inputs = tuple((s, Partitioning.BROADCAST, None) for s, _, _ in self._inputs)
        if name is None:
            return DataStream(self._env, inputs)
        if not isinstance(name, str) or not name or name.startswith("_"):
            raise ValueError(f"broadcast after '{self._describe()}': the broadcast state's "
                             f"name must be a non-empty str not starting with '_', got {name!r}")
        return BroadcastStream(Side(self._env, inputs, None, name, self._describe()))

    # -- two inputs (connected.py) -------------------------------------------

    def _side(self) -> Side:
        return Side(self._env, self._inputs, None, None, self._describe())

    def _other_side(self, other: Any, what: str) -> Side:
        if isinstance(other, BroadcastStream):
            return other.side
        if not isinstance(other, DataStream):
            raise TypeError(f"{what} after '{self._describe()}' takes a DataStream, "
                            f"got {other!r:.100}")
        stream: DataStream = other
        if stream._env is not self._env:
            raise ValueError(f"{what}: streams of different environments")
        return stream._side()

    def connect(self, other: DataStream | BroadcastStream) -> ConnectedStreams:
        """This stream and ``other`` into one two-input function
        (``.process(fn)``): a ``CoProcessFunction``; a
        ``KeyedCoProcessFunction`` if both are keyed; a
        (``Keyed``)``BroadcastProcessFunction`` if ``other`` is a
        ``BroadcastStream``."""
        return ConnectedStreams(self._side(), self._other_side(other, "connect"),
                                WindowedDataStream)

    def join(self, other: DataStream) -> JoinedStreams:
        """A window join with ``other``: ``.where(key).equal_to(key)
        .window(assigner).apply(fn)``, ``fn(left, right)`` per pair of
        records with equal keys in the same window."""
        side = self._other_side(other, "join")
        if side.broadcast is not None:
            raise TypeError(f"join after '{self._describe()}': cannot join a BroadcastStream")
        return JoinedStreams(self._side(), side, WindowedDataStream)

    def forward(self) -> DataStream:
        """Subtask i feeds subtask i (parallelisms must match)."""
        return DataStream(self._env, tuple((s, Partitioning.FORWARD, None)
                                           for s, _, _ in self._inputs))

    def union(self, *others: DataStream) -> DataStream:
        """This stream's records and ``others``', read as one stream."""
        inputs = list(self._inputs)
        for o in others:
            if not isinstance(o, DataStream):
                raise TypeError(f"union takes DataStreams, got {o!r:.100}")
            theirs = self._inputs_of(o)
            if theirs is None:
                raise ValueError("union of streams from different environments")
            inputs.extend(theirs)
        return DataStream(self._env, tuple(inputs))

    # -- cycles --------------------------------------------------------------

    def assign_timestamps_and_watermarks(self, strategy: Any) -> DataStream:
        """Give records event time: each record's timestamp from
        ``strategy``'s extractor, and watermarks generated per parallel
        instance (chained after a source at its parallelism: per source
        split group). Upstream watermarks stop here; this operator's replace
        them. ``strategy``: an ``ef.WatermarkStrategy``."""
        if not isinstance(strategy, WatermarkStrategy):
            raise TypeError(f"assign_timestamps_and_watermarks needs an ef.WatermarkStrategy, "
                            f"got {strategy!r:.100}")
        return self._then("timestamps", lambda uid: AssignTimestampsSpec(strategy))

    def iterate(self) -> IterativeStream:
        """Start a loop: the returned stream carries this stream's records and
        everything later fed back with :meth:`IterativeStream.close_with`."""
        node = self._add("iterate", IterationHeadSpec())
        return IterativeStream(self._env, ((node.id, Partitioning.DEFAULT, None),), node)

    # -- operator attributes ------------------------------------------------

    def _describe(self) -> str:
        if self._node is not None:
            return self._node.uid
        nodes = self._env.graph.nodes
        return " + ".join(nodes[s].uid for s, _, _ in self._inputs)

    def _own_node(self, what: str) -> Node:
        if self._node is None:
            raise TypeError(
                f"{what} applies to the operator just added; key_by, union, rebalance and "
                f"broadcast add none (after '{self._describe()}')"
            )
        return self._node

    def set_parallelism(self, n: int) -> DataStream:
        """Run the operator just added as ``n`` parallel subtasks."""
        node = self._own_node("set_parallelism")
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"operator '{node.uid}': parallelism must be an int, got {n!r}")
        if n < 1:
            raise ValueError(f"operator '{node.uid}': parallelism must be >= 1, got {n}")
        if node.max_source_parallelism is not None and n > node.max_source_parallelism:
            raise ValueError(
                f"operator '{node.uid}': this source cannot run with parallelism {n} "
                f"(at most {node.max_source_parallelism})"
            )
        node.parallelism = n
        return self

    def name(self, label: str) -> DataStream:
        """Name the operator just added; the name is also its identity in
        checkpoints, so it must be unique in the job."""
        node = self._own_node("name")
        if not isinstance(label, str) or not label or "/" in label or label.startswith("."):
            raise ValueError(f"operator '{node.uid}': invalid name {label!r}")
        for other in self._env.graph.nodes:
            if other is not node and other.uid == label:
                raise ValueError(f"operator name {label!r} is already used in this job")
        node.uid = label
        node.named = True
        return self

    @property
    def operator_name(self) -> str:
        """The uid of the operator just added (its name, if it was given one)."""
        return self._own_node("operator_name").uid

    # -- sinks ---------------------------------------------------------------

    def sink_to(self, sink: Sink) -> DataStream:
        """Write the records to ``sink`` (an ``ef.Sink``)."""
        if not isinstance(sink, Sink):
            raise TypeError(
                f"sink_to after '{self._describe()}' needs an ef.Sink, got {sink!r:.100}"
            )
        # The sink's description (e.g. ``file-sink:counts``) tells sinks of
        # one stream apart without counting on the order they were added in.
        node = self._add("sink", SinkSpec(sink), detail=sink.name, is_sink=True)
        return DataStream(self._env, (), node)

    def print(self) -> DataStream:
        """Print each record to stdout (``ef.PrintSink``: not transactional)."""
        return self.sink_to(PrintSink())

    # -- keyed operations on a non-keyed stream: say what to do -----------------

    def _needs_key(self, what: str) -> TypeError:
        return TypeError(
            f"{what} after '{self._describe()}' needs a keyed stream: call key_by(...) first"
        )

    def count(self) -> DataStream:
        """Keyed streams only: raises ``TypeError`` (call ``key_by`` first)."""
        raise self._needs_key("count()")

    def reduce(self, fn: Callable[[Any, Any], Any]) -> DataStream:
        """Keyed streams only: raises ``TypeError`` (call ``key_by`` first)."""
        raise self._needs_key("reduce()")

    def sum(self, value_fn: Callable[[Any], Any] = _second) -> DataStream:
        """Keyed streams only: raises ``TypeError`` (call ``key_by`` first)."""
        raise self._needs_key("sum()")

    def map_with_state(self, fn: Callable[[Any, Any], tuple[Any, Any]]) -> DataStream:
        """Keyed streams only: raises ``TypeError`` (call ``key_by`` first)."""
        raise self._needs_key("map_with_state()")

    def process(self, fn: KeyedProcessFunction) -> DataStream:
        """Keyed streams only: raises ``TypeError`` (call ``key_by`` first)."""
        raise self._needs_key("process()")


class KeyedStream(DataStream):
    """A stream partitioned by key; its operators keep per-key state."""

    def __init__(self, env: StreamEnvironment, inputs: tuple[_Input, ...],
                 key_fn: Callable[[Any], Any]) -> None:
        super().__init__(env, inputs)
        self.key_fn = key_fn

    def count(self) -> DataStream:
        """Emits ``(key, running count)`` per record."""
        return self._then("count", lambda uid: KeyedCountSpec(self.key_fn))

    def reduce(self, fn: Callable[[Any, Any], Any]) -> DataStream:
        """Emits ``(key, fn(previous, record))`` per record (the record itself first)."""
        def make(uid: str) -> KeyedReduceSpec:
            _check_callable(fn, "reduce function", f"operator '{uid}'")
            return KeyedReduceSpec(self.key_fn, fn)
        return self._then("reduce", make)

    def sum(self, value_fn: Callable[[Any], Any] = _second) -> DataStream:
        """Emits ``(key, running sum of value_fn(record))`` per record."""
        def make(uid: str) -> KeyedSumSpec:
            _check_callable(value_fn, "sum value_fn", f"operator '{uid}'")
            return KeyedSumSpec(self.key_fn, value_fn)
        return self._then("sum", make)

    def map_with_state(self, fn: Callable[[Any, Any], tuple[Any, Any]]) -> DataStream:
        """``fn(record, state_or_None) -> (output, new_state)``; a new state of
        ``None`` clears the key's state."""
        def make(uid: str) -> MapWithStateSpec:
            _check_callable(fn, "map_with_state function", f"operator '{uid}'")
            return MapWithStateSpec(self.key_fn, fn)
        return self._then("map_with_state", make)

    def process(self, fn: KeyedProcessFunction) -> DataStream:
        """``fn`` (an ``ef.KeyedProcessFunction``) per record, with keyed state
        and timers."""
        def make(uid: str) -> KeyedProcessSpec:
            if isinstance(fn, type):
                raise TypeError(f"operator '{uid}': process takes an instance, got the class "
                                f"{fn.__name__}; write process({fn.__name__}())")
            if not isinstance(fn, KeyedProcessFunction):
                raise TypeError(
                    f"operator '{uid}': process needs an ef.KeyedProcessFunction, got {fn!r:.100}"
                )
            return KeyedProcessSpec(self.key_fn, fn)
        return self._then("process", make)

    def _side(self) -> Side:
        return Side(self._env, self._inputs, self.key_fn, None, self._describe())

    def interval_join(self, other: KeyedStream) -> IntervalJoin:
        """An event-time interval join with the keyed stream ``other``:
        ``.between(lower, upper).apply(fn)``."""
        return IntervalJoin(self._side(), self._other_side(other, "interval_join"),
                            WindowedDataStream)

    def window(self, assigner: WindowAssigner) -> WindowedStream:
        """Group each key's records into windows (``ef.TumblingEventTimeWindows``,
        ``SlidingEventTimeWindows``, ``EventTimeSessionWindows``,
        ``TumblingProcessingTimeWindows``); finish with ``reduce``,
        ``aggregate``, ``sum``, ``count`` or ``process``."""
        if not isinstance(assigner, WindowAssigner):
            raise TypeError(f"window after '{self._describe()}' needs a window assigner such "
                            f"as ef.TumblingEventTimeWindows(60.0), got {assigner!r:.100}")
        return WindowedStream(self._env, self._inputs, self.key_fn, assigner)


class WindowedStream:
    """``key_by(...).window(assigner)``: set ``allowed_lateness`` and
    ``side_output_late_data``, then apply the window function."""

    def __init__(self, env: StreamEnvironment, inputs: tuple[_Input, ...],
                 key_fn: Callable[[Any], Any], assigner: WindowAssigner) -> None:
        self._env = env
        self._inputs = inputs  # the keyed stream's: the window operator reads them
        self._key_fn = key_fn
        self._assigner = assigner
        self._lateness = 0.0
        self._late_tag: OutputTag | None = None

    def allowed_lateness(self, seconds: float) -> WindowedStream:
        """Keep each window this long after it fired: a late record within it
        fires the window again, with the updated result (event time only)."""
        seconds = check_allowed_lateness(seconds)
        if seconds and not self._assigner.is_event_time:
            raise ValueError(f"allowed_lateness: {type(self._assigner).__name__} are "
                             "processing-time windows, where no record is late")
        self._lateness = seconds
        return self

    def side_output_late_data(self, tag: OutputTag) -> WindowedStream:
        """Send records too late for all their windows to the side output
        ``tag`` (read it with ``get_side_output(tag)``) instead of dropping them."""
        if not isinstance(tag, OutputTag):
            raise TypeError(f"side_output_late_data needs an ef.OutputTag, got {tag!r:.100}")
        self._late_tag = tag
        return self

    def _apply(self, adapter: WindowAdapter) -> WindowedDataStream:
        check_window_function(adapter, self._assigner)
        tag = self._late_tag
        spec = WindowSpec(self._key_fn, self._assigner, adapter, self._lateness,
                          None if tag is None else tag.name)
        detail = f"{type(self._assigner).__name__}.{adapter.method}"
        node = _add_operator(self._env, self._inputs, "window", spec, detail=detail)
        return WindowedDataStream(self._env, node, tag)

    def reduce(self, fn: Callable[[Any, Any], Any]) -> WindowedDataStream:
        """``fn(a, b)`` folds a window's records; emits ``ef.WindowResult``."""
        return self._apply(ReduceAdapter(fn))

    def aggregate(self, agg: AggregateFunction) -> WindowedDataStream:
        """An ``ef.AggregateFunction`` per window (one accumulator each)."""
        return self._apply(AggregateAdapter(agg))

    def sum(self, value_fn: Callable[[Any], Any] = _second) -> WindowedDataStream:
        """The sum of ``value_fn(record)`` per window."""
        return self._apply(SumAdapter(value_fn))

    def count(self) -> WindowedDataStream:
        """The number of records per window."""
        return self._apply(CountAdapter())

    def process(self, fn: ProcessWindowFunction) -> WindowedDataStream:
        """``fn.process(key, window, elements)`` yields a window's outputs."""
        return self._apply(ProcessAdapter(fn))


class WindowedDataStream(DataStream):
    """The results of a window operator (or a two-input one):
    ``name``/``set_parallelism`` apply to the operator; ``get_side_output(tag)``
    reads its late records (or what its function wrote to ``tag``)."""

    def __init__(self, env: StreamEnvironment, node: Node, tag: OutputTag | None,
                 any_tag: bool = False) -> None:
        self._window_node = node
        self._tag = tag
        #: A function's ``ctx.output`` may write any side output (two inputs).
        self._any_tag = any_tag
        self._selects: list[Node] = []
        inputs: tuple[_Input, ...] = ((node.id, Partitioning.DEFAULT, None),)
        if tag is not None or any_tag:
            # The operator's outputs mix results and wrapped late records:
            # what reads this stream reads only the results.
            main = self._select("main_output", MainOutputSpec(), env)
            inputs = ((main.id, Partitioning.DEFAULT, None),)
        super().__init__(env, inputs, node)

    def _select(self, kind: str, spec: Any, env: StreamEnvironment | None = None) -> Node:
        graph = (env or self._env).graph
        source = self._window_node
        node = graph.add_node(kind, spec, inputs=[(source.id, Partitioning.DEFAULT)],
                              parallelism=source.parallelism)
        graph.add_edge(source.id, node.id, Partitioning.DEFAULT)
        self._selects.append(node)
        return node

    def set_parallelism(self, n: int) -> DataStream:
        """Run the window operator as ``n`` parallel subtasks."""
        super().set_parallelism(n)
        for node in self._selects:  # they chain to the window operator
            node.parallelism = n
        return self

    def get_side_output(self, tag: OutputTag) -> DataStream:
        """The records the window operator sent to ``tag`` (late data)."""
        if not isinstance(tag, OutputTag):
            raise TypeError(f"get_side_output needs an ef.OutputTag, got {tag!r:.100}")
        if tag != self._tag and not self._any_tag:
            declared = "none" if self._tag is None else repr(self._tag.name)
            raise ValueError(
                f"operator '{self._window_node.uid}' has no side output {tag.name!r} "
                f"(declared: {declared}); call side_output_late_data({tag!r}) before the "
                "window function")
        node = self._select("side_output", SideOutputSpec(tag))
        return DataStream(self._env, ((node.id, Partitioning.DEFAULT, None),), node)


class IterativeStream(DataStream):
    """The head of a loop. Close it with the stream to feed back."""

    def __init__(self, env: StreamEnvironment, inputs: tuple[_Input, ...], node: Node) -> None:
        super().__init__(env, inputs, node)
        self._closed = False

    def close_with(self, feedback: DataStream) -> None:
        """Feed ``feedback`` back into the head: the loop's back-edge. Its
        partitioning (``key_by``, ``rebalance``) applies to the feedback."""
        head = self._own_node("close_with")
        if self._closed:
            raise ValueError(f"loop '{head.uid}' is already closed")
        fed = self._inputs_of(feedback) if isinstance(feedback, DataStream) else None
        if fed is None:
            raise TypeError(f"loop '{head.uid}': close_with needs a DataStream of the same job")
        if not fed:
            raise TypeError(f"loop '{head.uid}': close_with needs a stream, not a sink")
        graph = self._env.graph
        for source, part, key_fn in fed:
            graph.add_edge(source, head.id, part, key_fn, feedback=True)
        self._closed = True
