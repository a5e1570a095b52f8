"""The two-input part of the DataStream API: ``ConnectedStreams``
(``a.connect(b)``), the window join's builders (``a.join(b).where(ka)
.equal_to(kb).window(assigner).apply(fn)``), the interval join's
(``a.key_by(ka).interval_join(b.key_by(kb)).between(lo, hi).apply(fn)``)
and ``BroadcastStream`` (``ds.broadcast("name")``).

Each input of a two-input operator gets a ``tag`` operator that makes its
records ``(side, record)`` pairs (``runtime/operators/two_input.py`` says
why), at its producer's parallelism (so it chains to it); the operator reads
the tagged inputs with each input's own partitioning, a keyed input by
``SideKeys``, which applies that side's key selector. The result stream is
made by ``datastream.py`` (the ``result`` callable each builder is given),
so this module needs no import of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eddyflow.functions import (
    BroadcastProcessFunction,
    CoProcessFunction,
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
)
from eddyflow.graph.logical import Node, Partitioning
from eddyflow.runtime.operators.broadcast import BroadcastSpec
from eddyflow.runtime.operators.co_process import CoProcessSpec, KeyedCoProcessSpec
from eddyflow.runtime.operators.joins import IntervalJoinSpec, WindowJoinFunction
from eddyflow.runtime.operators.keyed import KeyedSpec
from eddyflow.runtime.operators.stateless import MapSpec
from eddyflow.runtime.operators.two_input import LEFT, RIGHT, SideKeys, TagInput
from eddyflow.runtime.operators.windows import WindowSpec
from eddyflow.windowing.functions import ProcessAdapter
from eddyflow.windowing.windows import OutputTag, WindowAssigner

if TYPE_CHECKING:
    from eddyflow.datastream import DataStream
    from eddyflow.environment import StreamEnvironment

__all__ = [
    "BroadcastStream",
    "ConnectedStreams",
    "IntervalJoin",
    "JoinedStreams",
    "Side",
    "WindowedJoin",
]

#: ``result(env, node, late_tag, any_tag)``: the stream of an operator's
#: outputs (``datastream.WindowedDataStream``).
Result = Callable[[Any, Node, OutputTag | None, bool], Any]


@dataclass(frozen=True)
class Side:
    """One input of a two-input operator: what reads the stream (node id,
    partitioning, key selector per producer), its key selector if it is
    keyed, and its broadcast state's name if it is a broadcast stream."""

    env: StreamEnvironment
    inputs: tuple[tuple[int, Partitioning, Callable[[Any], Any] | None], ...]
    key_fn: Callable[[Any], Any] | None = None
    broadcast: str | None = None
    describe: str = ""


def _check_fn(fn: Any, kind: type, what: str, uid: str) -> None:
    if isinstance(fn, type):
        raise TypeError(f"operator '{uid}': {what} takes an instance, got the class "
                        f"{fn.__name__}; write {what}({fn.__name__}())")
    if not isinstance(fn, kind):
        raise TypeError(f"operator '{uid}': {what} needs an ef.{kind.__name__}, "
                        f"got {fn!r:.100}")


def _add_two_input(left: Side, right: Side, kind: str, make: Callable[[str], Any],
                   detail: str = "") -> Node:
    """Tag both inputs, add the operator (``make(uid)`` its spec) reading
    them, and its edges. Keyed inputs are read by key group with the
    operator's ``SideKeys``."""
    env = left.env
    if right.env is not env:
        raise ValueError("cannot connect streams of different environments")
    graph = env.graph
    keys = SideKeys(left.key_fn, right.key_fn)
    reads: list[tuple[int, Partitioning, Callable[[Any], Any] | None]] = []
    for index, side in ((LEFT, left), (RIGHT, right)):
        for source, part, _ in side.inputs:
            tag = graph.add_node("tag", MapSpec(TagInput(index)),
                                 inputs=[(source, Partitioning.DEFAULT)],
                                 detail=f"input{index + 1}", parallelism_of=source)
            graph.add_edge(source, tag.id, Partitioning.DEFAULT)
            if side.key_fn is not None:
                reads.append((tag.id, Partitioning.KEY_GROUP, keys))
            else:
                reads.append((tag.id, part, None))
    uid = graph.generated_uid(kind, [(s, p) for s, p, _ in reads], detail)[0]
    spec = make(uid)
    node = graph.add_node(kind, spec, inputs=[(s, p) for s, p, _ in reads], detail=detail,
                          keyed=isinstance(spec, KeyedSpec))
    for source, part, key_fn in reads:
        graph.add_edge(source, node.id, part, key_fn)
    return node


class BroadcastStream:
    """``ds.broadcast(name)``: a stream every subtask of the operator it is
    connected to receives whole, carrying the broadcast state ``name``.
    Connect a stream to it (``events.connect(rules_b)`` or
    ``events.key_by(k).connect(rules_b)``) and process with a
    ``BroadcastProcessFunction`` or ``KeyedBroadcastProcessFunction``."""

    def __init__(self, side: Side) -> None:
        self.side = side

    @property
    def state_name(self) -> str:
        """The name of the broadcast state this stream carries."""
        assert self.side.broadcast is not None
        return self.side.broadcast


class ConnectedStreams:
    """``a.connect(b)``: two streams one function processes together."""

    def __init__(self, left: Side, right: Side, result: Result) -> None:
        self.left = left
        self.right = right
        self._result = result

    def process(self, fn: Any) -> DataStream:
        """``fn`` over both inputs: an ``ef.CoProcessFunction``
        (``process1``/``process2``), an ``ef.KeyedCoProcessFunction`` when
        both inputs are keyed, or a (``Keyed``)``BroadcastProcessFunction``
        when the second is a ``BroadcastStream``. ``ctx.output(tag, value)``
        writes to a side output: read it with ``get_side_output(tag)`` on
        the returned stream."""
        left, right = self.left, self.right
        keyed = left.key_fn is not None
        if right.broadcast is not None:
            name = right.broadcast
            want: type = KeyedBroadcastProcessFunction if keyed else BroadcastProcessFunction
            kind = "broadcast_process"

            def make(uid: str) -> Any:
                _check_fn(fn, want, "process", uid)
                if not keyed and isinstance(fn, KeyedBroadcastProcessFunction):
                    raise TypeError(f"operator '{uid}': a KeyedBroadcastProcessFunction needs "
                                    "a keyed stream: key_by(...) before connect")
                return BroadcastSpec(SideKeys(left.key_fn, None), name, fn)
            node = _add_two_input(left, right, kind, make, detail=name)
        else:
            if keyed != (right.key_fn is not None):
                raise TypeError(
                    f"connect '{left.describe}' with '{right.describe}': key both inputs "
                    "(key_by on each, for a KeyedCoProcessFunction) or neither")

            def make(uid: str) -> Any:
                if keyed:
                    _check_fn(fn, KeyedCoProcessFunction, "process", uid)
                    return KeyedCoProcessSpec(SideKeys(left.key_fn, right.key_fn), fn)
                _check_fn(fn, CoProcessFunction, "process", uid)
                if isinstance(fn, KeyedCoProcessFunction):
                    raise TypeError(f"operator '{uid}': a KeyedCoProcessFunction needs keyed "
                                    "inputs: key_by(...) on both before connect")
                return CoProcessSpec(fn)
            node = _add_two_input(left, right, "co_process", make)
        return self._result(left.env, node, None, True)  # type: ignore[no-any-return]


class JoinedStreams:
    """``a.join(b)``: name the key of each side with ``where`` (of ``a``) and
    ``equal_to`` (of ``b``), then the windows with ``window``."""

    def __init__(self, left: Side, right: Side, result: Result) -> None:
        self.left = left
        self.right = right
        self.result = result
        self.where_key: Callable[[Any], Any] | None = None

    def where(self, key: Callable[[Any], Any]) -> JoinedStreams:
        """The key selector of the first stream's records."""
        if not callable(key):
            raise TypeError(f"join: where needs a key selector, got {key!r:.100}")
        self.where_key = key
        return self

    def equal_to(self, key: Callable[[Any], Any]) -> WindowedJoin:
        """The key selector of the second stream's records."""
        if self.where_key is None:
            raise TypeError("join: call where(key) before equal_to(key)")
        if not callable(key):
            raise TypeError(f"join: equal_to needs a key selector, got {key!r:.100}")
        return WindowedJoin(self, key)


class WindowedJoin:
    """``join(...).where(...).equal_to(...)``: give it the windows."""

    def __init__(self, joined: JoinedStreams, right_key: Callable[[Any], Any]) -> None:
        self._joined = joined
        self._right_key = right_key
        self._assigner: WindowAssigner | None = None

    def window(self, assigner: WindowAssigner) -> WindowedJoin:
        """The windows pairs are made in (``ef.TumblingEventTimeWindows``,
        ``SlidingEventTimeWindows``, ``EventTimeSessionWindows``,
        ``TumblingProcessingTimeWindows``)."""
        if not isinstance(assigner, WindowAssigner):
            raise TypeError(f"join: window needs a window assigner such as "
                            f"ef.TumblingEventTimeWindows(60.0), got {assigner!r:.100}")
        self._assigner = assigner
        return self

    def apply(self, fn: Callable[[Any, Any], Any]) -> DataStream:
        """``fn(left, right)`` per pair of records of the two sides with equal
        keys in the same window, emitted when the window fires."""
        j = self._joined
        assigner = self._assigner
        if assigner is None:
            raise TypeError("join: call window(assigner) before apply(fn)")
        keys = SideKeys(j.where_key, self._right_key)
        left = Side(j.left.env, j.left.inputs, keys.left, describe=j.left.describe)
        right = Side(j.right.env, j.right.inputs, keys.right, describe=j.right.describe)

        def make(uid: str) -> WindowSpec:
            if not callable(fn):
                raise TypeError(f"operator '{uid}': join function must be callable, "
                                f"got {fn!r:.100}")
            return WindowSpec(keys, assigner, ProcessAdapter(WindowJoinFunction(fn)))
        node = _add_two_input(left, right, "window_join", make,
                              detail=type(assigner).__name__)
        return self._joined.result(left.env, node, None, False)  # type: ignore[no-any-return]


class IntervalJoin:
    """``a.key_by(ka).interval_join(b.key_by(kb))``: set the bounds with
    ``between``, optionally ``side_output_late_data``, then ``apply``."""

    def __init__(self, left: Side, right: Side, result: Result) -> None:
        if left.key_fn is None or right.key_fn is None:
            raise TypeError(f"interval_join of '{left.describe}' with '{right.describe}' "
                            "needs two keyed streams: key_by(...) on each")
        self.left = left
        self.right = right
        self._result = result
        self._bounds: tuple[float, float] | None = None
        self._late: OutputTag | None = None

    def between(self, lower: float, upper: float) -> IntervalJoin:
        """Pair a record of the first stream at ``t`` with the records of the
        second at timestamps in ``[t + lower, t + upper]`` (both bounds
        inclusive; seconds, either may be negative)."""
        for what, v in (("lower", lower), ("upper", upper)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValueError(f"interval_join: between needs finite seconds, got "
                                 f"{what}={v!r:.100}")
        if lower > upper:
            raise ValueError(f"interval_join: between needs lower <= upper, got "
                             f"{lower} > {upper}")
        self._bounds = (float(lower), float(upper))
        return self

    def side_output_late_data(self, tag: OutputTag) -> IntervalJoin:
        """Send records behind the watermark (which pair with nothing) to the
        side output ``tag`` instead of dropping them."""
        if not isinstance(tag, OutputTag):
            raise TypeError(f"side_output_late_data needs an ef.OutputTag, got {tag!r:.100}")
        self._late = tag
        return self

    def apply(self, fn: Callable[[Any, Any], Any]) -> DataStream:
        """``fn(left, right)`` per pair, as soon as its second record arrives;
        the output carries the later of the two timestamps."""
        if self._bounds is None:
            raise TypeError("interval_join: call between(lower, upper) before apply(fn)")
        lower, upper = self._bounds
        late = self._late
        keys = SideKeys(self.left.key_fn, self.right.key_fn)

        def make(uid: str) -> IntervalJoinSpec:
            if not callable(fn):
                raise TypeError(f"operator '{uid}': join function must be callable, "
                                f"got {fn!r:.100}")
            return IntervalJoinSpec(keys, lower, upper, fn, None if late is None else late.name)
        node = _add_two_input(self.left, self.right, "interval_join", make)
        return self._result(self.left.env, node, late, False)  # type: ignore[no-any-return]
