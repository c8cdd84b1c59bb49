"""One decoding settings value: what the search, the sentence loop and the saved searches take.

A `DecodeSettings` is built once per command by `decode_settings`, from a config's `decode`
section and the values a command's own flags give over it (translate-text's `--beam_size`, ...),
each checked by config.py's `SEARCH_RULES`. Everything that decodes takes it: the search
(translate/decoding/search.py), the sentence loop (sentences.py), the saved searches
(programs.py), the reports, the trainer's dev and test decoding and the benchmarks. A new
decoding option is a field here, its rule in config.py and its use in the search.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from translate.config import SEARCH_RULES, DecodeConfig


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
    """How to decode: the search's settings, then the sentence loop's (frozen, hashable)."""

    # The search's: config.decode's fields of the same names (config.py says what each means),
    # with its defaults, the paper's.
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

    def for_search(self) -> DecodeSettings:
        """These settings as the search program depends on them: the loop's fields left at
        0 and `nbest` as 0 or 1 (whether n-best scores are asked for, not how many)."""
        return dataclasses.replace(self, nbest=min(self.nbest, 1), batch_size=0, parallel_batches=0)

    def program_name(self, shape: tuple[int, int]) -> str:
        """A file name for the search program of these settings over batches of `shape` [B, S]:
        every field the search depends on, so that a new field names new programs."""
        search = self.for_search()
        fields = [
            f"{f.name}={getattr(search, f.name)!r}"
            for f in dataclasses.fields(search)
            if f.name not in ("batch_size", "parallel_batches")
        ]
        return "-".join([*fields, f"{shape[0]}x{shape[1]}"]).replace("'", "")

    def described(self) -> dict[str, Any]:
        """The search's settings as a report records them."""
        return {
            "beam_size": self.beam_size,
            "length_penalty": self.length_penalty,
            "beam_stop": self.beam_stop,
            "max_extra_len": self.max_extra_len,
        }


def check_values(values: Mapping[str, Any], flag: str = "--{name}") -> None:
    """Refuses a decoding value that cannot decode, by config.py's rules (before anything loads).

    Args:
      values: {field of DecodeConfig: value}; fields without a rule are not checked here.
      flag: how the message names the field: "--{name}" (translate-text's own flags) or
        "--config.decode.{name}".

    Raises:
      ValueError: `--beam_size=-3: must be >= 1`.
    """
    for name, value in values.items():
        if name in SEARCH_RULES:
            ok, rule = SEARCH_RULES[name]
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
    names = [f.name for f in dataclasses.fields(DecodeSettings) if f.name != "nbest"]
    settings = DecodeSettings(
        **{name: given.get(name, getattr(decode, name)) for name in names}, nbest=nbest
    )
    if nbest > settings.beam_size:
        raise ValueError(
            f"--nbest={nbest} needs --beam_size >= {nbest} (now {settings.beam_size}): beam "
            "search keeps beam_size hypotheses"
        )
    return settings
