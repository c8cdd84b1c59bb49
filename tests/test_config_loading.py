"""Loading a config file (translate/config/loading.py, `load_config`): what its own code does
is named."""

import pytest

from translate import cli, train
from translate.config import load_config


@pytest.mark.parametrize("code", ["0", "", "'done'"])
def test_a_config_file_that_exits_is_an_error_naming_its_line(tmp_path, code):
    path = tmp_path / "exits.py"
    path.write_text(f"import sys\n\nsys.exit({code})\n")
    with pytest.raises(ValueError) as error:
        load_config(path)
    message = cli.user_error_message(error.value)
    assert message is not None and "\n" not in message
    assert message.startswith(f"--config={path}:3: the config file exits (sys.exit(")
    # translate-train stops with that line rather than exiting 0 having done nothing.
    workdir = tmp_path / "run"
    with pytest.raises(ValueError, match="the config file exits"):
        train.main([f"--config={path}", f"--workdir={workdir}"])
    assert not workdir.exists()
