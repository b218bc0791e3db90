"""Layer 3, tools a user runs on their own loop: diagnose, tracker, traces, batch size, DataLoader, fed loops;
imports measuring and verdicts."""
