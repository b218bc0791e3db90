"""Layer 2, verdicts: claims, verdicts, experiments, results, the lesson object, params; imports measure only."""
