"""Layer 3, tools a user runs on their own loop: tracker, traces, batch size, DataLoader; imports measure, verdicts."""
