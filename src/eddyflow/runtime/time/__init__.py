"""Time inside a task: clocks, the watermark valve, watermark generation and
timers."""
