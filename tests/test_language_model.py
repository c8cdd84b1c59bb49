"""Language-model mode: data.source=monolingual, sampling a continuation, the sample command."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_decoder_only import make_model, peaked
from test_model import unpacked_batch

from translate import sample as sample_command
from translate.data import synthetic
from translate.data.batching import BatchLayout, make_batch, plan_epoch
from translate.data.sources import load_data
from translate.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from translate.decoding.sampling import NEVER_DRAWN
from translate.decoding.search import greedy_search, sample_search
from translate.training.trainer import data_files, train_and_evaluate
from translate.workdir import Workdir


def write_german_side(directory, num_train=400, num_dev=16):
    """The synthetic grammar's German sentences as train.de and val.de."""
    directory.mkdir(parents=True, exist_ok=True)
    pairs = synthetic.generate_pairs(num_train + num_dev, seed=3)
    german = [de for _, de in pairs]
    (directory / "train.de").write_text("\n".join(german[:num_train]) + "\n", encoding="utf-8")
    (directory / "val.de").write_text("\n".join(german[num_train:]) + "\n", encoding="utf-8")
    return german[:num_train]


def german_dev(directory):
    return (directory / "val.de").read_text(encoding="utf-8").splitlines()


def as_language_model(config, data_dir):
    config.model.architecture = "decoder_only"
    config.data.source = "monolingual"
    config.data.dir = str(data_dir)
    return config.validate()


def test_monolingual_text_needs_the_decoder_only_architecture(config):
    config.data.source = "monolingual"
    with pytest.raises(ValueError, match="data.source=monolingual: needs --config.model.arch"):
        config.validate()


def test_a_missing_text_file_is_an_error_naming_the_flag_before_the_workdir_changes(
    config, tmp_path
):
    write_german_side(tmp_path / "text")
    as_language_model(config, tmp_path / "text").data.train_prefix = "nothing"
    with pytest.raises(FileNotFoundError, match=r"--config.data.dir=.*nothing\.de"):
        load_data(config, data_files(Workdir(tmp_path / "run")))
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_monolingual_batches_score_every_token_of_every_sentence(config, tmp_path):
    german = write_german_side(tmp_path / "text")
    as_language_model(config, tmp_path / "text")
    data = load_data(config, data_files(Workdir(tmp_path / "run")))
    assert data.test_text is None and data.dev_text == ([""] * 16, german_dev(tmp_path / "text"))
    assert not data.translations  # no BLEU for a language model's text
    layout = BatchLayout(config.data.row_len, rows=8, num_micro=1)
    rows = plan_epoch(data.train, layout, seed=0, epoch=0)[0]
    batch = make_batch(data.train, rows, layout)
    pairs = [p for row in rows for p in row]
    # The source side is an empty sentence: its EOS alone, one per pair.
    assert set(np.asarray(batch.src)[batch.src_segments > 0].tolist()) == {EOS_ID}
    assert int((batch.src_segments > 0).sum()) == len(pairs)
    # The loss weighs every target slot: each sentence's tokens and its EOS.
    sentences = [data.tokenizer.decode(data.train.tgt(p)) for p in pairs]
    assert set(sentences) <= set(german)
    expected = sum(len(data.tokenizer.encode([s])[0]) + 1 for s in sentences)
    assert int((batch.tgt_segments > 0).sum()) == expected
    weights = np.asarray(batch.tgt_out)[batch.tgt_segments > 0]
    assert (weights != PAD_ID).all() and int((weights == EOS_ID).sum()) == len(pairs)


def lm_source(rows):
    return jnp.full((rows, 1), EOS_ID, jnp.int32)  # an empty source: EOS alone


def continuations(graphdef, params, src, prompt, seed, temperature, top_k, max_new):
    """translate-sample's call: the prompt [P] forced, `max_new` pieces after it at most."""
    stream = jnp.tile(jnp.array([[seed, 0]], jnp.uint32), (src.shape[0], 1))
    prefix = jnp.tile(jnp.asarray([prompt], jnp.int32), (src.shape[0], 1))
    tokens, _ = sample_search(
        (graphdef,),
        (params,),
        src,
        stream,
        prefix,
        method="topk" if top_k else "ancestral",
        temperature=temperature,
        top_k=top_k,
        max_extra_len=len(prompt) + max_new,
    )
    return tokens[:, 0]  # [B, L]


def test_sampling_from_the_top_1_token_is_greedy_decoding():
    graphdef, params = peaked(make_model(dropout_rate=0.0))
    src = lm_source(3)
    greedy, _ = greedy_search((graphdef,), (params,), src, max_extra_len=8)
    sampled = continuations(graphdef, params, src, [], 0, 0.7, 1, 8)
    np.testing.assert_array_equal(sampled[:, :8], greedy[:, :8])


@pytest.mark.slow  # 8 s on 2 cores; top 1 = greedy stays in the default run
def test_samples_keep_the_prompt_and_draw_only_from_the_top_k():
    model = make_model(dropout_rate=0.0)  # untrained: flat distributions, varied samples
    graphdef, params = nnx.split(model, nnx.Param)
    src = lm_source(4)
    tokens = continuations(graphdef, params, src, [7, 9], 1, 1.0, 3, 6)
    np.testing.assert_array_equal(tokens[:, :2], jnp.tile(jnp.array([[7, 9]]), (4, 1)))
    inputs = jnp.concatenate([jnp.full((4, 1), BOS_ID, jnp.int32), tokens[:, :-1]], axis=1)
    logits = model(unpacked_batch(src, inputs))  # [B, L, V]: next-token logits
    logits = logits.at[..., jnp.asarray(NEVER_DRAWN)].set(-jnp.inf)  # never drawn
    top3 = np.asarray(jax.lax.top_k(logits, 3)[1])
    for b, row in enumerate(np.asarray(tokens)):
        for t in range(2, len(row)):
            if EOS_ID in row[2:t]:
                assert row[t] == PAD_ID
            elif t == 2 + 6:  # the prompt and 6 new pieces: only EOS may follow
                assert row[t] == EOS_ID
            else:
                assert row[t] in top3[b, t]
    # Another seed draws other samples at this temperature.
    other = continuations(graphdef, params, src, [7, 9], 2, 1.0, 3, 6)
    assert not np.array_equal(tokens, other)


@pytest.mark.slow  # a short training and a sampling compile: about half a minute of CPU
def test_a_language_model_trains_on_one_text_file_and_samples(config, tmp_path, capsys):
    write_german_side(tmp_path / "text")
    as_language_model(config, tmp_path / "text")
    assert train_and_evaluate(config, tmp_path / "run") is None  # no translations to score
    sample_command.main(
        [
            f"--workdir={tmp_path / 'run'}",
            "--prompt=der",
            "--num_samples=3",
            "--temperature=0.8",
            "--top_k=5",
            "--max_new_tokens=10",
        ]
    )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(line.startswith("der") for line in lines)
