"""One decoding settings value: what the search, the sentence loop and the saved searches take.

A `DecodeSettings` is built once per command by `decode_settings`, from a config's `decode`
section and the values a command's own flags give over it (translate-text's `--beam_size`, ...),
each checked by config/rules.py's `SEARCH_RULES`. Everything that decodes takes it: the search
(translate/decoding/search.py), the sentence loop (sentences.py), the saved searches
(saved_searches.py), the reports, the trainer's dev and test decoding and the benchmarks. A new
decoding option is a field here, its rule in config/rules.py and its use in the search.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from translate.config import SEARCH_RULES, DecodeConfig

# The ways of drawing samples (sampling.draw) and of choosing among candidates (mbr.METRICS).
SAMPLING = ("ancestral", "topk", "topp", "epsilon")
MBR = ("chrf", "bleu")
# The lowest sampling temperature. The draw divides float32 log-probabilities by it: below
# about 1e-37 even the likeliest piece's overflows to -inf and nothing is left to draw (at 1e-40
# every output was PAD throughout, scored -8e9); 1e-30 keeps any log-probability above -3e8
# finite, and draws arg-max already (as --sampling=topk --top_k=1 does).
MIN_TEMPERATURE = 1e-30
# The highest: float32's largest, as the search takes the temperature (1e39 overflowed to inf
# there). The draw is flat over the drawable pieces long before it (sampling.draw).
MAX_TEMPERATURE = float(np.finfo(np.float32).max)
# The rules of the settings that only commands take (translate-text's --sampling ...), as
# config.SEARCH_RULES gives those of config.decode: {field: (condition, what it must be)}.
SAMPLING_RULES = {
    "sampling": (lambda v: v in ("", *SAMPLING), "must be one of " + ", ".join(SAMPLING)),
    "temperature": (
        lambda v: math.isfinite(v) and MIN_TEMPERATURE <= v <= MAX_TEMPERATURE,
        f"must be a finite number in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:.6g}] (float32's "
        "range; smaller is closer to arg-max)",
    ),
    "top_k": (lambda v: v >= 0, "must be >= 0 (1: arg-max)"),
    "top_p": (lambda v: 0.0 < v <= 1.0, "must be in (0, 1]"),
    "epsilon": (lambda v: 0.0 <= v < 1.0, "must be in [0, 1)"),
    "num_candidates": (lambda v: v >= 1, "must be >= 1"),
    "seed": (lambda v: 0 <= v < 2**32, "must be in [0, 2**32)"),
    "mbr": (lambda v: v in ("", *MBR), "must be one of " + ", ".join(MBR)),
}


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
    """How to decode: the search's settings, then the sentence loop's (frozen, hashable)."""

    # The search's: config.decode's fields of the same names (config/sections.py says what each
    # means), with its defaults, the paper's.
    beam_size: int = DecodeConfig.beam_size
    length_penalty: float = DecodeConfig.length_penalty
    max_extra_len: int = DecodeConfig.max_extra_len
    beam_stop: str = DecodeConfig.beam_stop
    # The N best translations of each sentence with their scores (beam search's length-
    # normalised ones, whatever the width); 0: the best translation alone.
    nbest: int = 0
    # The sentence loop's, also config.decode's: sentences per batch, batches searched at once.
    batch_size: int = DecodeConfig.batch_size
    parallel_batches: int = DecodeConfig.parallel_batches
    # Sampling in place of the beam (search.sample_search): "" (off), "ancestral", "topk",
    # "topp" or "epsilon" (sampling.draw says what each keeps), from the model's distribution
    # at `temperature`.
    sampling: str = ""
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    epsilon: float = 0.0
    # The candidates of each sentence: samples, or the beam's n-best (at most beam_size).
    num_candidates: int = 1
    # The samples' seed: each line's draws depend on it and on the line's place in the input.
    seed: int = 0
    # Minimum-Bayes-risk choice among the candidates by sentence "chrf" or "bleu" (mbr.py);
    # "": the candidate the search ranks first.
    mbr: str = ""
    # The search's too (config.decode's): whether greedy and beam search never choose BOS.
    ban_start: bool = DecodeConfig.ban_start

    def for_search(self) -> DecodeSettings:
        """These settings as the search program depends on them: the loop's fields, the seed
        (an input of the program) and the choice among candidates left at their defaults, and
        `nbest` as 0 or 1 (whether n-best scores are asked for, not how many); beam search's
        candidates count as n-best."""
        wants_scores = self.nbest > 0 or (self.num_candidates > 1 and not self.sampling)
        return dataclasses.replace(
            self,
            nbest=int(wants_scores),
            batch_size=0,
            parallel_batches=0,
            seed=0,
            mbr="",
        )

    def program_name(self, shape: tuple[int, ...]) -> str:
        """A file name for the search program of these settings over batches of `shape`,
        [B, S] or [B, S, P] with target prefixes (P = 0 is [B, S]):
        every field the search depends on, so that a new field names new programs."""
        search = self.for_search()
        fields = [
            f"{f.name}={getattr(search, f.name)!r}"
            for f in dataclasses.fields(search)
            if f.name not in ("batch_size", "parallel_batches", "seed", "mbr")
        ]
        shape = tuple(shape[:2]) if len(shape) == 3 and not shape[2] else tuple(shape)
        return "-".join([*fields, "x".join(map(str, shape))]).replace("'", "")

    def described(self) -> dict[str, Any]:
        """The search's settings as a report records them (sampling's only when sampling)."""
        described = {
            "beam_size": self.beam_size,
            "length_penalty": self.length_penalty,
            "beam_stop": self.beam_stop,
            "max_extra_len": self.max_extra_len,
        }
        if self.sampling:
            described.update(
                {
                    name: getattr(self, name)
                    for name in ("sampling", "temperature", "top_k", "top_p", "epsilon", "seed")
                }
            )
        if self.sampling or self.num_candidates > 1:
            described["num_candidates"] = self.num_candidates
        if self.mbr:
            described["mbr"] = self.mbr
        return described


def check_values(values: Mapping[str, Any], flag: str = "--{name}") -> None:
    """Refuses a decoding value that cannot decode, by config/rules.py's rules (before anything
    loads).

    Args:
      values: {field of DecodeConfig: value}; fields without a rule are not checked here.
      flag: how the message names the field: "--{name}" (translate-text's own flags) or
        "--config.decode.{name}".

    Raises:
      ValueError: `--beam_size=-3: must be >= 1`.
    """
    for name, value in values.items():
        if name in SEARCH_RULES or name in SAMPLING_RULES:
            ok, rule = SEARCH_RULES.get(name) or SAMPLING_RULES[name]
            if not ok(value):
                raise ValueError(f"{flag.format(name=name)}={value}: {rule}")


def decode_settings(
    decode: DecodeConfig, given: Mapping[str, Any] = {}, nbest: int = 0
) -> DecodeSettings:
    """The settings of `decode` (a config's section) with the `given` values over them.

    Args:
      decode: the config's decoding section (the workdir's, for a trained model).
      given: values a command's flags set, {field: value}, checked by `check_values`.
      nbest: how many translations of each sentence to give (0: the best alone).

    Raises:
      ValueError: a given value breaks its rule, or `nbest` is negative or wider than the beam.
    """
    check_values(given)
    if nbest < 0:
        raise ValueError(f"--nbest={nbest}: must be >= 0 (0: the best translation alone)")
    # config.decode's fields come from the config, the others (sampling's) from their defaults.
    fields = [f for f in dataclasses.fields(DecodeSettings) if f.name != "nbest"]
    settings = DecodeSettings(
        **{f.name: given.get(f.name, getattr(decode, f.name, f.default)) for f in fields},
        nbest=nbest,
    )
    check_combination(settings, given)
    return settings


def check_combination(
    settings: DecodeSettings, given: Mapping[str, Any], beam_known: bool = True
) -> None:
    """Refuses settings each valid alone that do not go together, naming the flags.

    `beam_known` False: the beam size is not yet the workdir's (checked before it is read),
    so what depends on it waits for the second check.
    """
    sampling, n = settings.sampling, settings.num_candidates
    for name, method in (("top_k", "topk"), ("top_p", "topp"), ("epsilon", "epsilon")):
        if name in given and sampling != method:
            raise ValueError(f"--{name}={given[name]} needs --sampling={method}")
    if "temperature" in given and not sampling:
        raise ValueError(f"--temperature={given['temperature']} needs --sampling")
    if "seed" in given and not sampling:
        raise ValueError(f"--seed={given['seed']} needs --sampling: beam search draws nothing")
    if sampling == "topk" and settings.top_k == 0:
        raise ValueError("--sampling=topk needs --top_k >= 1")
    if sampling == "epsilon" and settings.epsilon == 0.0:
        raise ValueError("--sampling=epsilon needs --epsilon > 0 (Freitag et al. 2023: 0.02)")
    if settings.mbr and n < 2:
        raise ValueError(
            f"--mbr={settings.mbr} needs --num_candidates >= 2 (now {n}): it chooses among them"
        )
    if not beam_known and not sampling and "beam_size" not in given:
        return
    if not sampling and n > settings.beam_size:
        raise ValueError(
            f"--num_candidates={n} needs --beam_size >= {n} (now {settings.beam_size}): the "
            "candidates are the beam's n-best; or sample them with --sampling"
        )
    wide = n if (sampling or settings.mbr) else settings.beam_size
    if settings.nbest > wide:
        what = "--num_candidates" if (sampling or settings.mbr) else "--beam_size"
        keeps = (
            "there are num_candidates candidates"
            if what == "--num_candidates"
            else "beam search keeps beam_size hypotheses"
        )
        raise ValueError(
            f"--nbest={settings.nbest} needs {what} >= {settings.nbest} (now {wide}): {keeps}"
        )
