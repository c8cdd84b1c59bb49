"""Tools beside the library, run from the repository root as `python -m scripts.NAME --flag=...`.

At the top: the tools a user runs on this project alone (training and decoding benchmarks,
checkpoint averaging, plots, a profile's summary, fault injection, the model's shape, MBR
against beam search, the Multi30k GPU recipe, SLURM, and the GPU check). In `compare/`: the
comparisons with other engines and tools (Flax's WMT example, CTranslate2, eflomal, mbrs), run as
`python -m scripts.compare.NAME`. Running as a module imports `translate` from the checkout
without touching `sys.path`.
"""
