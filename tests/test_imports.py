"""`import gpulab` is light: no plotting, widget or notebook-runner library until first used."""
import subprocess
import sys


def test_import_gpulab_loads_no_display_or_runner_libraries():
    code = ("import sys, gpulab; heavy = [m for m in ('matplotlib.pyplot', 'ipywidgets', 'papermill') "
            "if m in sys.modules]; print(heavy); assert not heavy, heavy; gpulab.plots; "
            "assert 'matplotlib.pyplot' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
