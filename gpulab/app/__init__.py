"""Layer 7, app: the course runner, parameter schemas, summary, self-check, HTML export; imports any layer below."""
