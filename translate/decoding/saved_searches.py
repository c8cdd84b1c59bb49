"""Searches kept on disk, traced, with the parameters they read: the text command's warm start.

The persistent compilation cache (translate/compilation.py) spares XLA's compile, but a command
still imports Flax and Orbax, builds the model, reads the checkpoint and traces and lowers the
search before that cache is even asked: about 4 s of a 5 s one-sentence `translate-text` on 2
cores. The text command keeps what those steps produce for the next command with the same
inputs (one "setup"):

  <cache>/searches/<setup>/params.npz   the parameters: every model's leaves, in order
  <cache>/searches/<setup>/setup.json   the steps they are and what loading them said
  <cache>/searches/<setup>/<search>.exported   one search per decoding settings and batch
                                        shape, traced and lowered (`jax.export`)
  <cache>/searches/<setup>/<search>.xla its executable, as XLA compiled it

A setup is named by a hash of everything its files depend on: each workdir's path, config.json
and vocab.model, and the name, size and modification time of every file under its checkpoints/
(a checkpoint saved, deleted or changed is another setup); the checkpoint choice (--step,
--average); this package's source code; the JAX version, the devices and the host's instruction
set, the JAX settings that change a program and XLA_FLAGS. A later command that finds its setup
complete reads the parameters and loads the executables: no Flax, no Orbax, no tracing, no
compiling. A search without its executable is compiled from the saved search, for real, and
its executable kept; a batch shape not yet there loads the model, traces that shape and keeps
it. Only an executable compiled in the process can be kept (on the CPU one that JAX read from
its own cache serializes without its code, JAX 0.10, and would fail when run), so the searches
are kept out of JAX's persistent cache (`SEARCH_OPTIONS`); were one read from there, each later
command would lower it and read it again. A search is traced without source lines in its
locations, so its saved form, and the name of its executable (a hash of that form and of the
machine), are the same for any checkout of the same code.

The store itself (the setups, their names, the executables, the size bound) is
translate/search_store.py's; this module traces, keeps and runs the searches through it, and
`open_models` is the warm start, one call. `<cache>` is the compilation cache's directory, and
the searches go with it: the flag and the
environment variable that move the cache or turn it off do the same here. The setups are kept
under `MAX_BYTES` together, the least recently used deleted first. Files are written whole
(a temporary file renamed into place), so processes may share the directory; a saved search or
executable is checked against its digest before it is read, and anything unreadable is made
again as if it were not there, said once. Like JAX's own cache, an executable is code that runs
when loaded: the directory must be the user's own.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from translate.compilation import cache_hits
from translate.decoding.search import search
from translate.decoding.sentences import (
    DecodeTimes,
    TracedSearches,
    inputs_shape,
    search_inputs,
    translate_sentences,
)
from translate.decoding.settings import DecodeSettings
from translate.search_store import (
    EXPORTED,
    SEARCH_OPTIONS,
    SavedEnsemble,
    kept_out_of_jax_cache,
    machine,
    source_lines_left_out,
)
from translate.streams import say
from translate.trained import load_ensemble
from translate.workdir import Workdir, read_config

# The GPU's attention (cuDNN's fused kernels, translate/models/attention.py) lowers to custom
# calls whose form jaxlib does not promise to keep, so jax.export refuses to save them unless
# told otherwise. A setup is named by the JAX version and the devices among the rest, so a saved
# search is read back only by the same jaxlib on the same devices: that promise guards nothing
# here. These are the forward kernels' targets (decoding runs no backward pass).
UNCHECKED_CALLS = [
    jax.export.DisabledSafetyCheck.custom_call(f"__cudnn${kernel}")
    for kernel in (
        "fmhaSoftmax",
        "fmhaScaleBiasSoftmax",
        "fmhaSoftmaxDropout",
        "fmhaScaleBiasSoftmaxDropout",
    )
]


class SavedSearches:
    """`search` at one decoding setting for one ensemble, traced once per batch shape.

    Each shape's search is read from the setup when an earlier command saved it there, else it
    is traced here (the model is loaded then, once, through `load_model`) and saved. Either way
    the search runs as that saved program (`jax.export`): its executable kept beside the setups,
    or compiled from it and kept, so a warm command runs what the cold one ran. Calls take
    source batches [B, S] and give what `search` gives.

    Args:
      setup: where the searches are kept; None keeps nothing (traced in this process only).
      leaves: the ensemble's parameter leaves, in `jax.tree.leaves(params)` order.
      load_model: gives (graphdefs, params) of the ensemble whose leaves these are.
      settings: the decoding settings the searches run.
      record: the steps and the lines said that `setup` records with the parameters, kept
        again with the model's own parameters when the saved ones do not fit it.
    """

    def __init__(
        self,
        setup: SavedEnsemble | None,
        leaves: Sequence[Any],
        load_model: Callable[[], tuple[tuple, tuple]],
        settings: DecodeSettings,
        record: tuple[Sequence[list[int]], Sequence[str]] = ((), ()),
    ):
        device = jax.local_devices()[0]
        self.leaves = [jax.device_put(x, device) for x in leaves]
        self.setup, self.load_model, self.settings = setup, load_model, settings
        self.record = record
        self.programs: dict[tuple[int, int, int], Callable] = {}
        self.unsaved: list[str] = []  # the searches jax.export could not save

    def compile(self, shape: Sequence[int]) -> None:
        """Makes the program for batches of `shape` ready, (B, S) or (B, S, P) with prefixes:
        its executable loaded, or compiled from the saved or newly traced search (XLA's
        persistent cache may hold it)."""
        shape = inputs_shape(shape)
        if shape in self.programs:
            return
        name = self.settings.program_name(shape) + EXPORTED
        found = self.setup.load_search(name) if self.setup is not None else None
        if found is not None and not self._fits(found[0], shape):
            self.setup.say_once("a saved search", ValueError(f"{name} was made for other shapes"))
            found = None
        if found is not None:
            exported, payload = found
        else:
            run = self._search_function()
            try:
                with source_lines_left_out():
                    exported = jax.export.export(jax.jit(run), disabled_checks=UNCHECKED_CALLS)(
                        self.leaves, *input_specs(shape)
                    )
            except ValueError as error:  # a program jax.export cannot save: run, not kept
                if not self.unsaved:
                    reason = str(error).splitlines()[0]
                    say(
                        f"WARNING: the search {name} cannot be kept ({reason}); it is compiled "
                        "in this process, every time\n"
                    )
                self.unsaved.append(name)
                self.programs[shape] = (
                    jax.jit(run).lower(self.leaves, *input_specs(shape)).compile()
                )
                return
            payload = self.setup.save_search(name, exported) if self.setup is not None else None
        key = None
        if payload is not None:
            key = hashlib.sha256(payload + json.dumps(machine()).encode()).hexdigest()[:32]
            in_tree = jax.tree.structure(((list(range(len(self.leaves))), 0, 0, 0), {}))
            loaded = self.setup.load_executable(key, in_tree, jax.tree.structure((0, 0)))
            if loaded is not None:
                self.programs[shape] = loaded
                return
        hits = cache_hits()
        lowered = jax.jit(exported.call).lower(self.leaves, *input_specs(shape))
        if key is None:  # nothing can be kept here: JAX's cache may hold it
            compiled = lowered.compile()
        else:
            with kept_out_of_jax_cache():
                compiled = lowered.compile(SEARCH_OPTIONS)
            # Only an executable compiled here is kept: on the CPU one that JAX read from its
            # cache serializes without its code (JAX 0.10), and would fail when run.
            if cache_hits() == hits:
                self.setup.save_executable(key, compiled)
        self.programs[shape] = compiled

    def _fits(self, exported, shape: tuple[int, int, int]) -> bool:
        """Whether a saved search takes these parameters and batches of `shape`."""
        expected = [(x.shape, x.dtype) for x in self.leaves]
        expected += [(s.shape, s.dtype) for s in input_specs(shape)]
        found = [(tuple(a.shape), np.dtype(a.dtype)) for a in exported.in_avals]
        return found == [(tuple(s), np.dtype(d)) for s, d in expected]

    def _search_function(self) -> Callable:
        """`search` at these settings as a function of (leaves, src, stream, prefix), with the
        model loaded (and its own parameters taken when the saved ones do not fit it)."""
        graphdefs, params = self.load_model()
        treedef = jax.tree.structure(params)
        leaves = jax.tree.leaves(params)
        shapes = [(x.shape, x.dtype) for x in leaves]
        if shapes != [(x.shape, x.dtype) for x in self.leaves]:
            # The saved parameters are not this model's (a damaged setup): the model's own
            # are used, and kept in their place.
            if self.setup is not None:
                error = ValueError("they do not fit the model")
                self.setup.say_once("the saved parameters", error)
            device = jax.local_devices()[0]
            self.leaves = [jax.device_put(x, device) for x in leaves]
            self.programs.clear()
            if self.setup is not None:
                self.setup.save(self.leaves, *self.record)
        settings = self.settings

        def run(leaves, src, stream, prefix):
            params = jax.tree.unflatten(treedef, leaves)
            return search(graphdefs, params, src, settings, stream=stream, prefix=prefix)

        return run

    def __call__(self, src: np.ndarray, stream=None, prefix=None):
        inputs = search_inputs(src, stream, prefix)
        shape = (*src.shape, inputs[2].shape[1])
        self.compile(shape)
        return self.programs[shape](self.leaves, *inputs)


def input_specs(shape: tuple[int, int, int]) -> list[jax.ShapeDtypeStruct]:
    """The shapes of `search_inputs`' arrays for batches of (B, S, P)."""
    rows, width, prefix = shape
    return [
        jax.ShapeDtypeStruct((rows, width), np.int32),
        jax.ShapeDtypeStruct((rows, 2), np.uint32),
        jax.ShapeDtypeStruct((rows, prefix), np.int32),
    ]


def said_lines() -> tuple[list[str], Callable[[str], None]]:
    """A list and a logger that writes each line to stderr and keeps it in the list."""
    lines: list[str] = []

    def keep(line: str) -> None:
        lines.append(line)
        say(line + "\n")

    return lines, keep


def passed_over(workdirs: Sequence[str], step, average: int, steps) -> bool:
    """Whether loading the newest checkpoint fell back to an older one (the newest unreadable
    now): a decision of this run, never kept for the next (which tries the newest again)."""
    if step is not None or average:
        return False
    from translate import checkpoint

    newest = [checkpoint.latest_step(Workdir(w).checkpoints) for w in workdirs]
    return any(s[-1] != n for s, n in zip(steps, newest))


class OpenedModels:
    """An ensemble opened for decoding, through the saved searches when they are kept.

    When the setup holds the parameters saved by an earlier command with the same workdirs,
    checkpoint choice, code and machine, they are read from there, and the models (Flax, Orbax,
    the checkpoint) are loaded only if a batch shape must be traced; otherwise the models are
    loaded now, and their parameters kept in the setup. What loading says on stderr (a
    checkpoint passed over) is said either way. `translate` decodes sentences with it.
    """

    def __init__(
        self,
        workdirs: Sequence[str],
        step: int | None,
        average: int,
        params: str = "auto",
        cache: str | None = None,
        matmul_dtype: str = "",
    ):
        self.workdirs, self.choice = list(workdirs), (step, average, params, matmul_dtype)
        self.setup = SavedEnsemble.find(cache, self.workdirs, *self.choice)
        saved = self.setup.load() if self.setup is not None else None
        self.models: tuple[tuple, tuple] | None = None
        if saved is not None:
            self.leaves, self.steps, self.said = saved
            for line in self.said:
                say(line + "\n")
            first = Workdir(self.workdirs[0])
            self.tokenizer, self.config = first.tokenizer(), read_config(first)
        else:
            self.said, keep = said_lines()
            ensemble = load_ensemble(self.workdirs, step, average, keep, params, matmul_dtype)
            self.leaves, self.steps = jax.tree.leaves(ensemble.params), ensemble.steps
            self.tokenizer, self.config = ensemble.tokenizer, ensemble.config
            self.models = ensemble[:2]
            if self.setup is not None and not passed_over(self.workdirs, step, average, self.steps):
                self.setup.save(self.leaves, self.steps, self.said)
        self._searches: dict[DecodeSettings, Any] = {}

    def load_model(self) -> tuple[tuple, tuple]:
        """The ensemble's (graphdefs, params), loaded on the first call when read from a setup."""
        if self.models is None:
            step, average, params, matmul_dtype = self.choice
            ensemble = load_ensemble(
                self.workdirs, step, average, lambda line: None, params, matmul_dtype
            )
            self.models = ensemble[:2]
        return self.models

    def searches(self, settings: DecodeSettings):
        """The search at `settings`: saved in the setup, or traced here when nothing is kept."""
        if settings not in self._searches:
            if self.setup is None:  # nothing kept: the search traced as evaluation traces it
                self._searches[settings] = TracedSearches(*self.load_model(), settings)
            else:
                self._searches[settings] = SavedSearches(
                    self.setup, self.leaves, self.load_model, settings, (self.steps, self.said)
                )
        return self._searches[settings]

    def translate(
        self,
        sentences: Sequence[str],
        settings: DecodeSettings,
        times: DecodeTimes | None = None,
        on_batch: Callable[[int], None] | None = None,
        prefixes: Sequence[str] | None = None,
        first_line: int = 0,
    ) -> list[list[tuple[float, str]]]:
        """`translate_sentences` with this ensemble's searches at `settings`."""
        return translate_sentences(
            None,
            None,
            self.tokenizer,
            sentences,
            settings,
            self.config.data.max_len,
            times=times,
            on_batch=on_batch,
            searches=self.searches(settings),
            prefixes=prefixes,
            first_line=first_line,
        )
