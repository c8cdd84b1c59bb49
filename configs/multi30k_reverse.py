"""Multi30k German->English: the recipe's model and budget the other way, the reverse model that
back-translates the training targets in `translate-distill --reverse_config=multi30k_reverse`.

    translate-data multi30k --dir=data/multi30k      # once
    translate-train --config=multi30k_reverse --workdir=/tmp/multi30k_de_en

Everything but the direction is configs/multi30k.py's (one shared vocabulary serves both
directions); inside the pipeline the languages are set from the teachers' in any case.
"""

import pathlib

from translate.config import Config, load_config


def get_config() -> Config:
    config = load_config(pathlib.Path(__file__).with_name("multi30k.py"))
    config.data.src_lang, config.data.tgt_lang = "de", "en"
    return config
