"""Event-time windowing, the runtime-independent half: watermark strategies,
window assigners, session merging, window-function adapters, the window
lifecycle rules. Pure Python with no runtime imports: the
window operator in ``eddyflow.runtime`` adapts these to keyed state and
timers, and the tests check them against a plain-Python reference.

The event-time rule (a record is late iff ``t < watermark``; a window fires
when ``watermark >= end``) is written down once, in
``eddyflow.windowing.watermarks``.
"""

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
from eddyflow.windowing.lifecycle import (
    Horizon,
    TimerAction,
    check_allowed_lateness,
    cleanup_at,
    cleanup_time,
    effective_lateness,
    fire_time,
    fires_on_element,
    horizon,
    is_window_late,
    on_timer,
    route_record,
    should_fire,
    timers_to_register,
)
from eddyflow.windowing.merging import MergeResult, add_window, merge_windows
from eddyflow.windowing.watermarks import (
    BoundedOutOfOrdernessGenerator,
    WatermarkStrategy,
    is_late,
)
from eddyflow.windowing.windows import (
    EventTimeSessionWindows,
    OutputTag,
    SlidingEventTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    TumblingWindows,
    WindowAssigner,
    WindowResult,
)

__all__ = [
    "AggregateAdapter",
    "AggregateFunction",
    "BoundedOutOfOrdernessGenerator",
    "CountAdapter",
    "EventTimeSessionWindows",
    "Horizon",
    "MergeResult",
    "OutputTag",
    "ProcessAdapter",
    "ProcessWindowFunction",
    "ReduceAdapter",
    "SlidingEventTimeWindows",
    "SumAdapter",
    "TimeWindow",
    "TimerAction",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "TumblingWindows",
    "WatermarkStrategy",
    "WindowAdapter",
    "WindowAssigner",
    "WindowResult",
    "add_window",
    "check_allowed_lateness",
    "check_window_function",
    "cleanup_at",
    "cleanup_time",
    "effective_lateness",
    "fire_time",
    "fires_on_element",
    "horizon",
    "is_late",
    "is_window_late",
    "merge_windows",
    "on_timer",
    "route_record",
    "should_fire",
    "timers_to_register",
]
