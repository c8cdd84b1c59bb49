"""The text command's older name: `python -m translate.translate` is translate/translate_text.py.

Kept so that commands written before the rename still run; new ones use `translate-text` or
`python -m translate.translate_text`.
"""

from translate import cli
from translate.translate_text import main

if __name__ == "__main__":
    cli.run(main, teardown=False)
