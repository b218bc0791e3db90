"""Layer 1, measuring: device, peaks, dtypes, timing, monitor, profiler, FLOPs, memory, host; imports no layer."""
