"""Config loading and command-line overrides (translate/config/)."""

import json
import pathlib
import re

import pytest

from translate.config import Config, config_from_dict, load_config

CONFIGS = sorted((pathlib.Path(__file__).parent.parent / "configs").glob("*.py"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_file_loads_and_validates(path):
    # load_config validates; every rule of Config.validate must let every shipped config pass.
    config = load_config(path)
    assert config.validate() is config
    assert config.model.d_model % config.model.num_heads == 0


def test_the_defaults_validate():
    assert Config().validate() == Config()


# Values that cannot work, as typed on the command line: each must stop the run at load time with
# an error naming its flag and value, not fail later (num_heads=0 once raised ZeroDivisionError
# inside the check) or lose data (keep_checkpoints=0 let Orbax delete every checkpoint).
BAD_VALUES = [
    ("model.num_layers", "0"),
    ("model.d_model", "0"),
    ("model.d_model", "-512"),
    ("model.d_model", "511"),
    ("model.d_model", "500"),  # not divisible by 8 heads
    ("model.num_heads", "0"),
    ("model.num_heads", "-8"),
    ("model.num_heads", "3"),  # 512 is not divisible by 3: the message names both flags
    ("model.d_ff", "0"),
    ("model.dropout_rate", "1.0"),
    ("model.dropout_rate", "nan"),
    ("model.attention_dropout_rate", "-0.1"),
    ("model.activation_dropout_rate", "1.0"),
    ("model.dropout_bits", "philox"),
    ("model.compute_dtype", "float64"),
    ("model.matmul_dtype", "float16"),
    ("model.attention", "flash"),
    ("model.norm_position", "sandwich"),
    ("model.architecture", "gpt"),
    ("model.prefix_attention", "full"),
    ("model.prefix_attention", "bidirectional"),  # the encoder-decoder has no prefix
    ("data.source", "web"),
    ("data.source", "monolingual"),  # a language model needs the decoder-only architecture
    ("data.tfds_train_split", ""),
    ("data.src_lang", ""),
    ("data.tgt_lang", ""),
    ("data.tgt_lang", "en"),
    ("data.vocab_size", "0"),
    ("data.vocab_size", "4"),
    ("data.vocab_sample_size", "0"),
    ("data.max_len", "0"),
    ("data.max_len", "257"),
    ("data.row_len", "0"),
    ("data.tokens_per_batch", "0"),
    ("data.synthetic_num_train", "0"),
    ("data.synthetic_num_dev", "0"),
    ("data.synthetic_num_test", "-1"),
    ("train.num_train_steps", "0"),
    ("train.warmup_steps", "0"),
    ("train.learning_rate_scale", "0.0"),
    ("train.learning_rate_scale", "-1.0"),
    ("train.learning_rate_scale", "nan"),
    ("train.learning_rate_scale", "inf"),
    ("train.adam_beta1", "1.0"),
    ("train.adam_beta2", "-0.1"),
    ("train.adam_eps", "0.0"),
    ("train.adam_eps", "-inf"),
    ("train.weight_decay", "-0.1"),
    ("train.weight_decay", "1.0"),
    ("train.weight_decay", "nan"),
    ("train.label_smoothing", "inf"),
    ("train.optimizer", "sgd"),
    ("train.grad_accum_steps", "0"),
    ("train.grad_accum_steps", "98"),  # 25,000 // 256 = 97 rows, one per micro-batch at least
    ("train.seed", "-1"),
    ("train.log_every_steps", "0"),
    ("train.checkpoint_every_steps", "0"),
    ("train.max_consecutive_skips", "0"),
    ("train.stop_check_every_steps", "0"),
    ("data.train_prefix", ""),
    ("train.keep_checkpoints", "0"),
    ("train.keep_checkpoints", "-1"),
    ("train.on_nonfinite", "ignore"),
    ("train.eval_every_steps", "0"),
    ("decode.beam_size", "0"),
    ("decode.length_penalty", "-0.1"),
    ("decode.length_penalty", "nan"),
    ("decode.length_penalty", "inf"),
    ("decode.max_extra_len", "-1"),
    ("decode.batch_size", "0"),
    ("decode.parallel_batches", "0"),
    ("decode.eval_num_sentences", "-1"),
    ("decode.average_last", "0"),
    ("train.keep_checkpoints", "4"),  # base averages 5 at the end: the message names both flags
]


@pytest.mark.parametrize("field,value", BAD_VALUES, ids=[f"{f}={v}" for f, v in BAD_VALUES])
def test_a_value_that_cannot_work_is_an_error_naming_its_flag(field, value):
    with pytest.raises(ValueError, match=re.escape(f"--config.{field}={value}")) as error:
        load_config(CONFIGS[0].parent / "base.py", {field: value})
    assert str(error.value).startswith("invalid config: --config.")


@pytest.mark.parametrize(
    "field,value,rule",
    [
        ("model.d_model", "512", "must be int, not str"),
        ("train.keep_checkpoints", True, "must be int, not bool"),
        ("data.src_lang", None, "must be str, not NoneType"),
    ],
)
def test_a_config_file_value_of_the_wrong_type_is_an_error_naming_its_flag(field, value, rule):
    # A config file sets attributes directly, so no flag parser has checked the type.
    config = Config()
    section, name = field.split(".")
    setattr(getattr(config, section), name, value)
    with pytest.raises(ValueError, match=re.escape(f"--config.{field}={value}: {rule}")):
        config.validate()


def test_averaging_more_checkpoints_than_the_run_keeps_or_saves_is_an_error():
    base = CONFIGS[0].parent / "base.py"
    with pytest.raises(
        ValueError,
        match=re.escape(
            "--config.train.keep_checkpoints=5: must be >= --config.decode.average_last=6"
        ),
    ):
        load_config(base, {"decode.average_last": "6"})
    # 2,500 steps with a checkpoint every 1,000 save steps 1,000, 2,000 and 2,500.
    with pytest.raises(
        ValueError,
        match=re.escape(
            "--config.decode.average_last=5: must not exceed the 3 checkpoints that "
            "--config.train.num_train_steps=2500 saves at "
            "--config.train.checkpoint_every_steps=1000"
        ),
    ):
        load_config(base, {"train.num_train_steps": "2500"})
    assert load_config(base, {"train.num_train_steps": "4001"}).decode.average_last == 5


def test_the_encoders_own_embeddings_are_refused_where_there_is_no_encoder():
    config = Config()
    config.model.architecture = "decoder_only"
    config.model.share_encoder_decoder_embeddings = False
    with pytest.raises(ValueError, match="share_encoder_decoder_embeddings=False: must be true"):
        config.validate()


def test_an_int_may_stand_for_a_float():
    config = Config()
    config.train.learning_rate_scale = 2
    assert config.validate() is config


def test_base_config_is_the_paper_base_model():
    config = load_config(CONFIGS[0].parent / "base.py")
    m, t = config.model, config.train
    assert (m.num_layers, m.d_model, m.num_heads, m.d_ff, m.dropout_rate) == (6, 512, 8, 2048, 0.1)
    assert (t.adam_beta1, t.adam_beta2, t.adam_eps, t.warmup_steps) == (0.9, 0.98, 1e-9, 4000)
    assert t.label_smoothing == 0.1


@pytest.mark.parametrize(
    "name,num", [("base.py", 5), ("wmt14_base.py", 5), ("big.py", 20), ("wmt14_big.py", 20)]
)
def test_paper_configs_evaluate_the_mean_of_their_last_5_or_20_checkpoints(name, num):
    # Sec. 6.1; validate() has checked that the run keeps and saves that many.
    assert load_config(CONFIGS[0].parent / name).decode.average_last == num


def test_override_sets_a_typed_field():
    config = load_config(
        CONFIGS[0].parent / "base.py", {"model.num_layers": "2", "train.learning_rate_scale": "0.5"}
    )
    assert config.model.num_layers == 2 and config.train.learning_rate_scale == 0.5


def test_unknown_field_is_an_error_naming_the_flag():
    with pytest.raises(ValueError, match=r"--config.model.num_layer\b.*unknown field"):
        load_config(CONFIGS[0].parent / "base.py", {"model.num_layer": "2"})


def test_wrong_type_is_an_error_naming_the_flag():
    with pytest.raises(ValueError, match="--config.model.d_model.*int"):
        load_config(CONFIGS[0].parent / "base.py", {"model.d_model": "wide"})


def test_config_round_trips_through_its_dict_with_backslashes_and_quotes():
    config = load_config(CONFIGS[0].parent / "base.py")
    config.data.dir = 'C:\\data\\"wmt" 14'
    config.train.learning_rate_scale = 0.36
    config.data.src_lang = "en"
    assert config_from_dict(json.loads(json.dumps(config.to_dict()))) == config


def write_config_file(tmp_path, body: str) -> pathlib.Path:
    path = tmp_path / "mine.py"
    path.write_text(
        "from translate.config import Config\n\n\ndef get_config():\n"
        "    c = Config()\n"
        + "".join(f"    {line}\n" for line in body.splitlines())
        + "    return c\n"
    )
    return path


def test_a_misspelt_field_in_a_config_file_is_an_error_naming_the_file_and_the_field(tmp_path):
    path = write_config_file(tmp_path, "c.model.d_modle = 64")
    with pytest.raises(
        ValueError, match=r"config.model.d_modle is not a field.*did you mean d_model"
    ):
        load_config(path)
    with pytest.raises(ValueError, match=re.escape(str(path))):
        load_config(path)
    path = write_config_file(tmp_path, "c.trian = None")
    with pytest.raises(ValueError, match=r"config.trian is not a section"):
        load_config(path)


def test_a_misspelt_field_set_in_python_fails_validation():
    config = Config()
    config.train.num_train_step = 10
    with pytest.raises(ValueError, match=r"invalid config: config.train.num_train_step is not a"):
        config.validate()


@pytest.mark.parametrize("text", ["1e999", "-1e999", "1.5e0", "2.5"])
def test_an_int_field_refuses_an_infinite_or_fractional_value(text):
    with pytest.raises(
        ValueError, match=re.escape(f"--config.train.num_train_steps: cannot parse {text!r} as int")
    ):
        load_config(CONFIGS[0].parent / "tiny.py", {"train.num_train_steps": text})
    assert (
        load_config(
            CONFIGS[0].parent / "tiny.py", {"train.num_train_steps": "1e3"}
        ).train.num_train_steps
        == 1000
    )


def test_a_config_file_with_a_syntax_error_is_an_error_naming_its_file_and_line(tmp_path):
    path = write_config_file(tmp_path, "c.model.d_model = = 64")
    with pytest.raises(ValueError, match=re.escape(f"--config={path}:6: ")):
        load_config(path)


def test_a_config_file_that_raises_names_its_file_and_line(tmp_path):
    path = write_config_file(tmp_path, "c.model.d_model = undefined_name")
    with pytest.raises(ValueError, match=re.escape(f"--config={path}:6: NameError: ")):
        load_config(path)


@pytest.mark.parametrize(
    "field,value", [("train.keep_best_by", "dev_bleu"), ("train.early_stopping_patience", "2")]
)
def test_a_language_model_refuses_what_needs_dev_bleu(field, value):
    overrides = {
        "model.architecture": "decoder_only",
        "data.source": "monolingual",
        field: value,
    }
    with pytest.raises(ValueError, match=re.escape(f"--config.{field}={value}: needs dev BLEU")):
        load_config(CONFIGS[0].parent / "tiny.py", overrides)


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "from translate.config import Config\ndef get_config(size):\n    return Config()\n",
            r"get_config\(\) must take no arguments \(it needs size\)",
        ),
        ("import runpy\nrunpy.run_path(__file__)\n", "loads itself, without end"),
        (
            "from translate.config import load_config\ndef get_config():\n"
            "    return load_config(__file__)\n",
            "loads itself, without end",
        ),
        (
            "from translate.config import Config\ndef get_config():\n    c = Config()\n"
            "    c.model = {'d_model': 3}\n    return c\n",
            "config.model is a dict, not a ModelConfig",
        ),
        (
            "from translate.configs.tiny import get_config\n",
            r"cfg.py:1: ModuleNotFoundError.*call translate.config.load_config\('tiny'\)",
        ),
    ],
)
def test_a_config_file_that_cannot_give_a_config_is_one_line_naming_it(tmp_path, text, expected):
    """Each of these is one line naming the file, not a traceback."""
    path = tmp_path / "cfg.py"
    path.write_text(text)
    with pytest.raises(ValueError, match=expected) as error:
        load_config(str(path))
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_a_binary_config_file_is_not_a_python_file(tmp_path):
    path = tmp_path / "cfg.py"
    path.write_bytes(b"\x00\x89PNG\r\n" * 20)
    with pytest.raises(ValueError, match=r"cfg.py: not a Python file"):
        load_config(str(path))


def test_a_config_file_builds_on_a_shipped_config_through_load_config(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(
        "from translate.config import load_config\n\n\ndef get_config():\n"
        "    config = load_config('tiny')\n    config.train.num_train_steps = 3\n"
        "    return config\n"
    )
    config = load_config(str(path))
    assert config.train.num_train_steps == 3
    assert config.model.d_model == load_config("tiny").model.d_model
