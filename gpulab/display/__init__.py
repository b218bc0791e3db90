"""Layer 5, display: figures and interactive controls (loaded on first use); imports the layers 1-4 only."""
