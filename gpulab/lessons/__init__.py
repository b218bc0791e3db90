"""Layer 6, lessons: what only one notebook needs, one module per lesson; imports the layers 1-5 only."""
