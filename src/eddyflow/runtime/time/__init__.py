"""Time inside a task: clocks, the watermark valve and timers."""
