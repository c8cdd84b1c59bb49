"""Tools beside the library (benchmarks, checkpoint averaging, plots, the GPU check).

Each runs from the repository root as a module, `python -m scripts.NAME --flag=...`, so it
imports `translate` from the checkout without touching `sys.path`.
"""
