"""Display code: figures and interactive controls (matplotlib and ipywidgets load on first use)."""
