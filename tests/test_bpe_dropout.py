"""Subword sampling (BPE-dropout, data.src_subword_alpha and tgt_subword_alpha):
translate/data/bpe_dropout.py."""

import json

from translate.data.bpe_dropout import BPEDropout, SampledEpochs
from translate.data.corpus import tokenize_parallel


def sentences(n=60, seed=3):
    from translate.data import synthetic

    return synthetic.generate_pairs(n, seed=seed)


def test_sampled_segmentations_differ_by_epoch_repeat_by_seed_and_decode_back(tokenizer):
    pairs = sentences()
    src, tgt = [p[0] for p in pairs], [p[1] for p in pairs]
    corpus, dropped = tokenize_parallel(tokenizer, src, tgt, max_len=1000)
    assert dropped == 0
    sampled = SampledEpochs(corpus, tokenizer, alphas=(0.3, 0.3), max_len=1000, seed=5)
    first, second = sampled(1), sampled(2)

    def pieces(c):
        return [(c.src(i).tolist(), c.tgt(i).tolist()) for i in range(len(c))]

    assert pieces(first) != pieces(second)
    # The same seed and epoch in a sampler made afresh, after another epoch was sampled: the
    # same pieces (in another process too: the next test).
    again = SampledEpochs(corpus, tokenizer, alphas=(0.3, 0.3), max_len=1000, seed=5)
    again(2)
    assert pieces(again(1)) == pieces(first)
    assert pieces(SampledEpochs(corpus, tokenizer, (0.3, 0.3), 1000, seed=6)(1)) != pieces(first)
    # Every sampled pair decodes to its sentence (SentencePiece's normalized text).
    for i in range(len(corpus)):
        assert tokenizer.decode(first.src(i)) == tokenizer.decode(corpus.src(i))
        assert tokenizer.decode(first.tgt(i)) == tokenizer.decode(corpus.tgt(i))
    # One side alone: the other keeps its deterministic pieces, and the sampled side is what
    # it is with both sampled (each side's draw is its own).
    sources_only = SampledEpochs(corpus, tokenizer, alphas=(0.3, 0.0), max_len=1000, seed=5)(1)
    for i in range(len(corpus)):
        assert sources_only.src(i).tolist() == first.src(i).tolist()
        assert sources_only.tgt(i).tolist() == corpus.tgt(i).tolist()
    # More pieces than the deterministic segmentation (merges were dropped).
    assert len(first.src_tokens) > len(corpus.src_tokens)


# Sentences beyond the vocabulary's training text: other words, digits, punctuation, and
# characters it never saw (unknown pieces, which nothing merges with).
UNSEEN = [
    "Zwei Männer, 3 Hunde und 1.000 Äpfel: übermäßig!",
    "A café in Łódź serves crème brûlée at 9:45 p.m.",
    "Ωμέγα 東京 😀 mixed with the grammar's words",
    "x",
    "   spaces   between    words   ",
]


def test_bpe_dropout_at_alpha_0_is_sentencepieces_encoding(tokenizer, tmp_path):
    from translate.data.tokenizer import train_tokenizer

    texts = [s for pair in sentences(300, seed=11) for s in pair] + UNSEEN
    larger = train_tokenizer(texts[:400] + UNSEEN[:2], 600, tmp_path / "vocab.model")
    for vocab in (tokenizer, larger):
        dropout = BPEDropout(vocab)
        unknown = 0
        for ids in vocab.encode(texts):
            assert dropout.encode(dropout.words(ids), 0.0, None) == ids
            unknown += ids.count(vocab.processor.unk_id())
        assert unknown > 0


def test_a_tag_opening_the_sources_stays_through_sampled_segmentations(tmp_path):
    from translate.data.corpus import TokenizedCorpus
    from translate.data.tokenizer import train_tokenizer

    pairs = sentences(200, seed=11)
    texts = [s for pair in pairs for s in pair]
    vocab = train_tokenizer(texts, 300, tmp_path / "vocab.model", reserved=["<BT>"])
    tag = vocab.processor.piece_to_id("<BT>")
    src, tgt = vocab.encode([p[0] for p in pairs]), vocab.encode([p[1] for p in pairs])
    corpus = TokenizedCorpus.from_lists([[tag] + s for s in src], tgt)
    sampled = SampledEpochs(corpus, vocab, alphas=(0.5, 0.0), max_len=1000, seed=0)(0)
    assert all(sampled.src(i)[0] == tag for i in range(len(sampled)))
    assert all(tag not in sampled.src(i)[1:].tolist() for i in range(len(sampled)))
    decoded = [vocab.decode(sampled.src(i)) for i in range(len(sampled))]
    assert decoded == [p[0] for p in pairs]


SAMPLE_IN_A_SUBPROCESS = """
import json, sys
sys.path.insert(0, {tests!r})
from test_bpe_dropout import sentences
from translate.data.corpus import tokenize_parallel
from translate.data.bpe_dropout import SampledEpochs
from translate.data.tokenizer import Tokenizer

tokenizer = Tokenizer({vocab!r})
pairs = sentences()
corpus, _ = tokenize_parallel(tokenizer, [p[0] for p in pairs], [p[1] for p in pairs], 1000)
sampled = SampledEpochs(corpus, tokenizer, alphas=(0.3, 0.2), max_len=1000, seed=5)(3)
print(json.dumps([(sampled.src(i).tolist(), sampled.tgt(i).tolist()) for i in range(len(sampled))]))
"""


def test_sampled_pieces_are_the_same_in_another_process(tokenizer):
    import pathlib
    import subprocess
    import sys

    code = SAMPLE_IN_A_SUBPROCESS.format(
        tests=str(pathlib.Path(__file__).parent), vocab=str(tokenizer.path)
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    theirs = [tuple(pair) for pair in json.loads(out.stdout)]
    pairs = sentences()
    corpus, _ = tokenize_parallel(tokenizer, [p[0] for p in pairs], [p[1] for p in pairs], 1000)
    sampled = SampledEpochs(corpus, tokenizer, alphas=(0.3, 0.2), max_len=1000, seed=5)(3)
    mine = [(sampled.src(i).tolist(), sampled.tgt(i).tolist()) for i in range(len(sampled))]
    assert mine == theirs
    assert mine != [(corpus.src(i).tolist(), corpus.tgt(i).tolist()) for i in range(len(corpus))]


def test_a_sampled_pair_too_long_keeps_its_deterministic_pieces(tokenizer):
    pairs = sentences()
    corpus, _ = tokenize_parallel(tokenizer, [p[0] for p in pairs], [p[1] for p in pairs], 1000)
    longest = max(max(len(corpus.src(i)), len(corpus.tgt(i))) for i in range(len(corpus))) + 1
    free = SampledEpochs(corpus, tokenizer, alphas=(0.5, 0.5), max_len=10**6, seed=0)(0)
    bounded = SampledEpochs(corpus, tokenizer, alphas=(0.5, 0.5), max_len=longest, seed=0)(0)
    assert len(bounded) == len(corpus)
    too_long = 0
    for i in range(len(corpus)):
        fits = max(len(free.src(i)), len(free.tgt(i))) + 1 <= longest
        expected = free if fits else corpus
        too_long += not fits
        assert bounded.src(i).tolist() == expected.src(i).tolist()
        assert bounded.tgt(i).tolist() == expected.tgt(i).tolist()
    assert too_long >= 1
