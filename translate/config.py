"""Typed experiment configuration: dataclasses whose defaults are the paper's base model.

A config file is Python with a `get_config()` that returns a `Config`. Entry points load it
with `load_config(path_or_name, overrides)` (a file, or an example config of configs/ by name),
where overrides come from `--config.<section>.<field>=value` flags; an unknown section or field,
or a value that does not parse as the field's type, is an error that names the flag. The
comment above each field is its description: `parse_flags` prints it for `--help`
(`field_descriptions` reads it from this file), so a new field needs one. Dataclasses and flags
of our own rather than ml_collections and absl flags: the fields are typed and checked by
`validate`, and `--help` is written from the same comments a reader sees here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib.util
import inspect
import io
import json
import math
import pathlib
import textwrap
import tokenize
import traceback
import typing
from collections.abc import Callable
from typing import Any, Literal

# Each choice a config field offers, declared once: validation, `--help` and the code that acts
# on the field read these (`choices`), and that code refuses a value outside them.
DropoutBits = Literal["threefry", "hash"]
ComputeDtype = Literal["auto", "float32", "bfloat16", "float16"]
MatmulDtype = Literal["compute", "bfloat16"]
AttentionKernel = Literal["auto", "xla", "cudnn"]
NormPosition = Literal["post", "pre"]
Architecture = Literal["encoder_decoder", "decoder_only"]
PrefixAttention = Literal["causal", "bidirectional"]
PositionScheme = Literal["sinusoidal", "rotary", "relative"]
Normalization = Literal["layernorm", "rmsnorm"]
FeedForwardKind = Literal["relu", "gelu", "swiglu", "geglu"]
DataSource = Literal["files", "synthetic", "tfds", "monolingual"]
LrDecay = Literal["rsqrt", "linear", "cosine"]
Optimizer = Literal["adam", "muon"]
LossKeep = Literal["auto", "exp", "logits", "logits_bf16"]
OnNonfinite = Literal["stop", "skip"]
KeepBestBy = Literal["dev_bleu", ""]
BeamStop = Literal["exact", "finished"]


def choices(kind: Any) -> tuple | None:
    """The values a field of type `kind` may take when it is a choice (a Literal), else None."""
    return typing.get_args(kind) if typing.get_origin(kind) is Literal else None


def choice_rule(values: tuple) -> str:
    """ "must be 'a', 'b' or 'c'": the rule a choice's value breaks."""
    quoted = [f"'{v}'" for v in values]
    return "must be " + " or ".join(
        [", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted
    )


def check_choice(value: Any, kind: Any, name: str) -> Any:
    """`value` when it is one of the choice `kind`'s; ValueError naming `name` otherwise. For code
    that branches on a choice: a value it does not know is refused, never read as another."""
    if value not in choices(kind):
        raise ValueError(f"{name}={value!r}: {choice_rule(choices(kind))}")
    return value


@dataclasses.dataclass
class ModelConfig:
    # Encoder and decoder layers each (Sec. 3.1: N = 6).
    num_layers: int = 6
    # Width of every sub-layer output and embedding (Sec. 3.1).
    d_model: int = 512
    # Attention heads; d_model must divide evenly (Sec. 3.2.2: h = 8).
    num_heads: int = 8
    # Inner width of the position-wise feed-forward network (Sec. 3.3).
    d_ff: int = 2048
    # Dropout on sub-layer outputs and on embedding + position sums (Sec. 5.4: P_drop = 0.1).
    dropout_rate: float = 0.1
    # Dropout on the attention weights after the softmax, in training (not in the paper;
    # tensor2tensor's attention_dropout, fairseq's --attention-dropout). Above 0 the training
    # step forms the weights itself instead of calling the fused cuDNN kernel; decoding is
    # unchanged.
    attention_dropout_rate: float = 0.0
    # Dropout on the feed-forward network's inner ReLU activations, in training (not in the
    # paper; tensor2tensor's relu_dropout, fairseq's --activation-dropout).
    activation_dropout_rate: float = 0.0
    # Where dropout's random bits come from: "threefry" (JAX's generator) or "hash" (a counter
    # hash with a third of the integer operations, models/layers.py's hashed_words: other masks,
    # so other numbers; the Multi30k recipe's whole step x0.955, scripts/benchmark.py --variant).
    dropout_bits: DropoutBits = "threefry"
    # "auto": bfloat16 on GPU/TPU, float32 on CPU. Parameters are always float32.
    compute_dtype: ComputeDtype = "auto"
    # The operands of the linear layers' and the output projection's matrix products: "compute"
    # (the compute dtype) or "bfloat16" (rounded to bfloat16 in both passes, accumulated and
    # returned in float32, the rest of the model in the compute dtype: mixed precision as TPUs
    # run float32 products by default). On this project's CPU (AMD EPYC, AVX512-BF16) such
    # products ran about 1.8x as fast, the Multi30k recipe's step 1.4x (docs/speed.md).
    matmul_dtype: MatmulDtype = "compute"
    # Attention kernel of jax.nn.dot_product_attention: "xla", "cudnn" (fused, GPU only, bf16 or
    # fp16) or "auto": cuDNN on GPU when the compute dtype and head size allow, else XLA.
    attention: AttentionKernel = "auto"
    # Where each sub-layer's LayerNorm sits: "post" is the paper's LayerNorm(x + Sublayer(x))
    # (Sec. 3.1); "pre" is x + Sublayer(LayerNorm(x)) with a final LayerNorm on each stack
    # (Xiong et al. 2020), which trains stably at higher learning rates and depths.
    norm_position: NormPosition = "post"
    # "encoder_decoder" (the paper) or "decoder_only": one stack of num_layers self-attention
    # + feed-forward layers over `source <sep> target`, scored on the target
    # (models/decoder_only.py).
    architecture: Architecture = "encoder_decoder"
    # Decoder-only: "causal" (each token sees those before it) or "bidirectional" (source
    # tokens also see the source tokens after them: a prefix LM).
    prefix_attention: PrefixAttention = "causal"
    # How tokens know their place: "sinusoidal" (Sec. 3.5, added to the embeddings), "rotary"
    # (Su et al. 2021: each self-attention's queries and keys rotated by their position) or
    # "relative" (T5's learned bias on each self-attention's scores by bucketed distance,
    # Raffel et al. 2020). Cross-attention takes no positions in either (models/positions.py).
    positions: PositionScheme = "sinusoidal"
    # "layernorm" (Ba et al. 2016, the paper's) or "rmsnorm" (Zhang & Sennrich 2019: no mean,
    # no bias), for every normalisation of the model.
    normalization: Normalization = "layernorm"
    # The position-wise feed-forward network: "relu" (Sec. 3.3), "gelu" (tanh form), or the
    # gated "swiglu" and "geglu" (Shazeer 2020: act(x W) * (x V), then W2). A gated network has
    # three matrices of d_model x d_ff against two: d_ff = 2/3 of the ungated width keeps the
    # parameter count.
    feed_forward: FeedForwardKind = "relu"
    # Key and value heads (grouped-query attention, Ainslie et al. 2023; 1 = multi-query,
    # Shazeer 2019): each serves num_heads / num_kv_heads query heads, in self- and
    # cross-attention. 0 = num_heads, the paper's.
    num_kv_heads: int = 0
    # Biases in the linear layers (the paper's; the key projection never has one). False drops
    # them from every attention projection and the feed-forward network, as T5 and Llama do.
    use_bias: bool = True


@dataclasses.dataclass(frozen=True)
class TrainCorpus:
    # File stem of the corpus's parallel files in data.dir ({prefix}.{src_lang} and
    # {prefix}.{tgt_lang}); give this or tfds_split.
    prefix: str = ""
    # A split of the TFDS dataset data.tfds_name ("train", "train[:10%]"); give this or prefix.
    tfds_split: str = ""
    # An upsampling factor: each epoch draws round(weight x its pairs) of the corpus's pairs,
    # every pair floor(weight) times and a random share of them once more (at least one pair).
    weight: float = 1.0
    # A piece prepended to each of the corpus's sources, reserved in the shared vocabulary when
    # it is trained (tagged back-translation, Caswell et al. 2019: "<BT>"); "" = none.
    tag: str = ""


@dataclasses.dataclass
class DataConfig:
    # "files" (parallel text in `dir`), "synthetic" (generated by translate.data.synthetic),
    # "tfds" (a TFDS translation dataset, prepared and read without TensorFlow by
    # translate.data.wmt) or
    # "monolingual" (one language's text, {train,dev}_prefix.tgt_lang in `dir`, for a language
    # model: the decoder-only architecture scored on every token).
    source: DataSource = "files"
    # Directory holding {train,dev,test}_prefix.{src_lang,tgt_lang} for source "files".
    dir: str = ""
    # File stem of the training, development and test sets inside `dir` ("" for no dev or test
    # set; a named set whose files are missing is an error).
    train_prefix: str = "train"
    dev_prefix: str = "val"
    test_prefix: str = "test"
    # Several training corpora drawn together, in place of train_prefix and tfds_train_split:
    # each a TrainCorpus of a prefix (files in `dir`) or a tfds_split (of tfds_name), a weight
    # (an upsampling factor: an epoch draws round(weight x its pairs) of them) and a tag (a piece
    # reserved in the vocabulary and put before each of its sources: tagged back-translation).
    # On the command line a JSON list: '[{"prefix": "train", "weight": 2}, {"prefix": "bt",
    # "tag": "<BT>"}]'. Each is tokenized once, into a cache of its own; () = the one corpus of
    # train_prefix (tfds_train_split).
    train_corpora: tuple[TrainCorpus, ...] = ()
    # TFDS dataset "name/config" for source "tfds"; both languages must be in its pair.
    tfds_name: str = "wmt14_translate/de-en"
    # Root of prepared TFDS datasets; "" means $TFDS_DATA_DIR, else TFDS's default
    # (~/tensorflow_datasets). Archives fetched by hand go in <root>/downloads/manual.
    tfds_data_dir: str = ""
    # TFDS splits for training, development and test; slices such as "train[:1%]" work.
    tfds_train_split: str = "train"
    tfds_dev_split: str = "validation"
    tfds_test_split: str = "test"
    # Language suffixes (language codes for TFDS); the source is translated into the target.
    src_lang: str = "en"
    tgt_lang: str = "de"
    # Pieces in the shared SentencePiece BPE vocabulary (Sec. 5.1: about 37,000).
    vocab_size: int = 37000
    # Sentences (both languages together) drawn at random, seeded by train.seed, to train the
    # vocabulary.
    vocab_sample_size: int = 1_000_000
    # Pairs with more tokens than this on either side (EOS included) are dropped and counted.
    max_len: int = 256
    # Length of a packed row of tokens; a batch is `tokens_per_batch // row_len` rows.
    row_len: int = 256
    # Token slots per side per optimizer step over all devices (Sec. 5.1: ~25,000).
    tokens_per_batch: int = 25_000
    # Number of pairs generated per split when source == "synthetic".
    synthetic_num_train: int = 20_000
    synthetic_num_dev: int = 500
    synthetic_num_test: int = 1_000
    # Subword regularisation (BPE-dropout; Kudo 2018, Provilkov et al. 2020): each epoch the
    # training sources (src_) and targets (tgt_) are segmented anew, every merge dropped with
    # this probability, seeded by train.seed and the epoch; 0 = off (the pieces tokenized once).
    # Dev and test keep the deterministic segmentation. A resumed run sees the pieces an
    # uninterrupted one sees (our own sampler, translate/data/bpe_dropout.py).
    src_subword_alpha: float = 0.0
    tgt_subword_alpha: float = 0.0


@dataclasses.dataclass
class TrainConfig:
    # Optimizer steps (Sec. 5.2: 100,000 for the base model).
    num_train_steps: int = 100_000
    # Linear warm-up steps of the learning-rate schedule (Sec. 5.3).
    warmup_steps: int = 4000
    # Multiplies the paper's schedule d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).
    learning_rate_scale: float = 1.0
    # After warm-up: "rsqrt" (the paper's step^-0.5), or "linear" or "cosine" from the same peak
    # towards 0 at num_train_steps, which helps runs too short for rsqrt to have fallen far.
    lr_decay: LrDecay = "rsqrt"
    # "adam": the paper's Adam (AdamW with train.weight_decay) for every parameter. "muon": Muon
    # (Jordan et al. 2024: momentum orthogonalised by Newton-Schulz iterations) for every linear
    # layer's kernel, its update scaled to AdamW's RMS (Liu et al. 2025) so that the same
    # learning rate and weight decay apply, and that Adam for the embedding, biases and
    # LayerNorms (training/optim.py). A run cannot switch it when it resumes.
    optimizer: Optimizer = "adam"
    # Adam hyper-parameters (Sec. 5.3).
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-9
    # Decoupled weight decay (Loshchilov & Hutter 2019; PyTorch's AdamW, fairseq's
    # --weight-decay): after Adam's update, every matrix and embedding (not the biases and
    # LayerNorm gains) also moves by -learning_rate * weight_decay * itself. 0 = off, the paper's
    # Adam; a run cannot switch it between 0 and non-zero when it resumes (another optimizer
    # state).
    weight_decay: float = 0.0
    # Label smoothing epsilon (Sec. 5.4).
    label_smoothing: float = 0.1
    # What the loss keeps from its forward pass for the backward pass (losses.py,
    # projected_cross_entropy): "exp" (fastest on CPUs), "logits" (fewer passes over the
    # [tokens x vocabulary] float32 logits, for GPUs), "logits_bf16" (the logits rounded to
    # bfloat16, half the bytes again), or "auto": "exp" on CPUs, else "logits".
    loss_keep: LossKeep = "auto"
    # An exponential moving average of the parameters, kept beside them and saved in the
    # checkpoints: ema = d * ema + (1 - d) * params after every applied step, with
    # d = min(ema_decay, (1 + step) / (10 + step)); the dev and final evaluations and the
    # decoding commands use it (their --params=raw the parameters themselves). 0 = off.
    ema_decay: float = 0.0
    # Micro-batches accumulated per optimizer step; the batch is split evenly among them.
    grad_accum_steps: int = 1
    # Optimizer steps run in one call of the jitted program (a lax.scan over this many batches):
    # one host dispatch for several steps, for a small model whose step the host bounds (on a
    # GPU: docs/speed.md). The steps agree with single steps to float32 rounding only, not bit
    # for bit. The log, checkpoint, dev-evaluation and multi-host stop intervals must be
    # multiples of it; steps left over at the end run one a call.
    steps_per_call: int = 1
    # Seed for parameters, data order and dropout.
    seed: int = 0
    # Steps between lines of the training log (loss, speed) in metrics.jsonl and TensorBoard.
    log_every_steps: int = 100
    # Steps between checkpoints; a run resumes from the newest.
    checkpoint_every_steps: int = 1000
    # Checkpoints kept on disk; at least decode.average_last, which the final evaluation averages.
    keep_checkpoints: int = 5
    # A step whose loss or gradient is not finite is never applied; "stop" ends the run there
    # (naming the step), "skip" carries on and counts such steps in the log.
    on_nonfinite: OnNonfinite = "stop"
    # With on_nonfinite "skip": this many skipped steps in a row stop the run (it has stopped
    # learning).
    max_consecutive_skips: int = 100
    # On several hosts: every this many steps they agree whether any received SIGTERM or SIGINT,
    # and all stop at the same step (a small all-gather; one process checks every step).
    stop_check_every_steps: int = 10
    # Dev loss and dev BLEU on `eval_num_sentences` dev sentences every this many steps.
    eval_every_steps: int = 1000
    # Start from another run's parameters: "WORKDIR" (its newest checkpoint) or "WORKDIR@STEP";
    # "" = off. The optimizer and the step start afresh (fine-tuning, a new domain); the
    # vocabulary is that run's. A resumed run continues from its own checkpoints instead.
    init_from: str = ""
    # "dev_bleu": also keep the checkpoint with the best dev BLEU so far, in the workdir's
    # best/ (a workdir of its own for evaluate, translate and init_from); "" = off.
    keep_best_by: KeepBestBy = ""
    # Stop after this many dev evaluations in a row without a better dev BLEU, then save and
    # test as at the last step; 0 = off (the paper trains a fixed number of steps).
    early_stopping_patience: int = 0
    # "A:B": a jax.profiler trace of steps A to B (as the log counts them) into the workdir's
    # profile/; "" = off.
    profile_steps: str = ""


@dataclasses.dataclass
class DecodeConfig:
    # Beam width (Sec. 6.1: 4); 1 is greedy decoding.
    beam_size: int = 4
    # alpha in the GNMT length penalty ((5 + len) / 6) ** alpha (Sec. 6.1: 0.6).
    length_penalty: float = 0.6
    # Output may be at most source length + this many tokens (Sec. 6.1: 50).
    max_extra_len: int = 50
    # When beam search stops a sentence: "exact", once no live hypothesis can beat its
    # beam_size finished ones (exact, but loose: it assumes the longest allowed output's length
    # penalty); "finished", once beam_size hypotheses have ended, EOS counting only among the
    # beam_size best candidates of a step (fairseq, CTranslate2, transformers' early_stopping).
    beam_stop: BeamStop = "exact"
    # Sentences decoded together. Chosen with `parallel_batches` on 2 CPU cores (BENCHMARKS.md):
    # 32 with 3 in flight decoded Multi30k's test2016 faster than 64 with 2 (beam 4
    # by 1.07-1.10x, greedy by 1.15-1.3x), with the same output tokens.
    batch_size: int = 32
    # Batches searched at once, each in its own thread: a search step is hundreds of small ops,
    # most of them on one core, so other batches in flight keep a 2-core CPU busy (beam 4 ran
    # 1.3-1.4x and greedy 1.1-1.4x as fast with 2 as with 1). The outputs do not change.
    parallel_batches: int = 3
    # Dev sentences decoded for BLEU during training (0 = whole dev set).
    eval_num_sentences: int = 200
    # The test report and the last dev BLEU of a training run decode the mean parameters of
    # the newest this many checkpoints (Sec. 6.1: 5 for base, 20 for big; 1 = the last step's).
    average_last: int = 5
    # The decoder layer (from 0) whose cross-attention, heads averaged, gives word alignments
    # (translate-text and translate-score --alignment); -1: the second-to-last, Garg et al.
    # 2019's choice for the paper's 6 layers. Recipes choose theirs on val against eflomal
    # (scripts/compare/alignment_agreement.py).
    alignment_layer: int = -1


# A validation rule: (field as "section.name", condition on its value, what it must be).
Rule = tuple[str, Callable[[Any], bool], str]

# The longest output past its source's length that decoding allows (decode.max_extra_len).
MAX_EXTRA_LEN = 1024
# The values of decode.beam_stop.
BEAM_STOPS = choices(BeamStop)
# The rules of the decoding settings that a command may also take as flags of its own
# (translate-text's --beam_size ...), as {field of DecodeConfig: (condition, what it must be)}:
# config.validate and translate/decoding/settings.py check them, the one place they are written.
SEARCH_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "beam_size": (lambda v: v >= 1, "must be >= 1"),
    "length_penalty": (lambda v: math.isfinite(v) and v >= 0.0, "must be a finite number >= 0"),
    # A cap past MAX_EXTRA_LEN makes every search allocate and, on a model that does not end
    # its outputs, run that many steps in one XLA call that no signal interrupts.
    "max_extra_len": (lambda v: 0 <= v <= MAX_EXTRA_LEN, f"must be in [0, {MAX_EXTRA_LEN}]"),
    "beam_stop": (
        lambda v: v in BEAM_STOPS,
        choice_rule(BEAM_STOPS),
    ),
    "batch_size": (lambda v: v >= 1, "must be >= 1"),
    "parallel_batches": (lambda v: v >= 1, "must be >= 1"),
}


@dataclasses.dataclass
class Config:
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    decode: DecodeConfig = dataclasses.field(default_factory=DecodeConfig)

    def validate(self) -> Config:
        """Raises ValueError naming the flag of the first value that cannot work; returns self.

        The message names the flag as it is typed, with its value and the rule it breaks:
        `invalid config: --config.train.keep_checkpoints=0: must be >= 1`.
        """
        # Names first: a dataclass takes any attribute, so `c.model.d_modle = 64` in a config
        # file would otherwise be ignored and the run would train the default.
        if unknown := unknown_field(self):
            raise ValueError(f"invalid config: {unknown}")
        # Types next, so that every rule below may compare and divide: a config file can set
        # any Python value, and NaN or inf passes a range check such as `> 0`.
        self._check_types()
        self._check_choices()
        # Checked in order, so a rule may rely on one above it: d_model % num_heads needs
        # num_heads >= 1.
        rules = [
            *self._model_rules(),
            *self._data_rules(),
            *self._train_rules(),
            *self._decode_rules(),
        ]
        for field, ok, rule in rules:
            section, name = field.split(".")
            if not ok(getattr(getattr(self, section), name)):
                raise ValueError(f"invalid config: {self._flag(field)}: {rule}")
        return self

    def _flag(self, field: str) -> str:
        """`field` ("section.name") as the flag that sets it, with its value."""
        section, name = field.split(".")
        value = getattr(getattr(self, section), name)
        if isinstance(value, (tuple, list)):  # a list of corpora: as the JSON that sets it
            value = json.dumps(
                [dataclasses.asdict(v) if dataclasses.is_dataclass(v) else repr(v) for v in value]
            )
        return f"--config.{field}={value}"

    def _check_types(self) -> None:
        for section in dataclasses.fields(self):
            for name, kind in typing.get_type_hints(type(getattr(self, section.name))).items():
                field = f"{section.name}.{name}"
                value = getattr(getattr(self, section.name), name)
                if not _has_type(value, kind):
                    raise ValueError(
                        f"invalid config: {self._flag(field)}: must be {type_name(kind)}, "
                        f"not {type(value).__name__}"
                    )
                if kind is float and not math.isfinite(value):
                    raise ValueError(f"invalid config: {self._flag(field)}: must be finite")

    def _check_choices(self) -> None:
        for section in dataclasses.fields(self):
            for name, kind in typing.get_type_hints(type(getattr(self, section.name))).items():
                values = choices(kind)
                if values and getattr(getattr(self, section.name), name) not in values:
                    field = f"{section.name}.{name}"
                    raise ValueError(f"invalid config: {self._flag(field)}: {choice_rule(values)}")

    def _model_rules(self) -> list[Rule]:
        """The model's rules, as (field, condition on its value, rule)."""
        m = self.model
        flag = self._flag
        return [
            ("model.num_layers", lambda v: v >= 1, "must be >= 1"),
            ("model.num_heads", lambda v: v >= 1, "must be >= 1"),
            # The position encoding pairs a sine and a cosine per frequency (Sec. 3.5).
            ("model.d_model", lambda v: v >= 2 and v % 2 == 0, "must be even and >= 2"),
            (
                "model.d_model",
                lambda v: v % m.num_heads == 0,
                f"must be divisible by {flag('model.num_heads')}",
            ),
            ("model.d_ff", lambda v: v >= 1, "must be >= 1"),
            (
                "model.num_kv_heads",
                lambda v: v == 0 or (1 <= v <= m.num_heads and m.num_heads % v == 0),
                f"must be 0 (= {flag('model.num_heads')}) or a divisor of it",
            ),
            # Rotary positions turn pairs of a head's channels.
            (
                "model.positions",
                lambda v: v != "rotary" or (m.d_model // max(m.num_heads, 1)) % 2 == 0,
                f"rotary needs an even head size ({flag('model.d_model')} / "
                f"{flag('model.num_heads')})",
            ),
            ("model.dropout_rate", lambda v: 0.0 <= v < 1.0, "must be in [0, 1)"),
            ("model.attention_dropout_rate", lambda v: 0.0 <= v < 1.0, "must be in [0, 1)"),
            ("model.activation_dropout_rate", lambda v: 0.0 <= v < 1.0, "must be in [0, 1)"),
            (
                "model.prefix_attention",
                lambda v: v == "causal" or m.architecture == "decoder_only",
                "applies only to --config.model.architecture=decoder_only",
            ),
        ]

    def _data_rules(self) -> list[Rule]:
        """The data's rules; some depend on the model's architecture."""
        m, d = self.model, self.data
        flag = self._flag
        return [
            (
                "data.source",
                lambda v: v != "monolingual" or m.architecture == "decoder_only",
                "needs --config.model.architecture=decoder_only (a language model)",
            ),
            # Empty dev and test splits mean none; without a training split there is no run.
            ("data.tfds_train_split", lambda v: v != "", "must be non-empty"),
            ("data.train_prefix", lambda v: v != "", "must be non-empty"),
            ("data.src_lang", lambda v: v != "", "must be non-empty"),
            ("data.tgt_lang", lambda v: v != "", "must be non-empty"),
            (
                "data.tgt_lang",
                lambda v: v != d.src_lang,
                f"must differ from {flag('data.src_lang')}",
            ),
            # The four special ids (pad, unk, bos, eos) and at least one piece; SentencePiece
            # itself asks for more on a corpus with more distinct characters.
            ("data.vocab_size", lambda v: v >= 5, "must be >= 5"),
            ("data.vocab_sample_size", lambda v: v >= 1, "must be >= 1"),
            ("data.row_len", lambda v: v >= 1, "must be >= 1"),
            # Every pair holds at least its EOS; a longer pair than a row could never be packed.
            ("data.max_len", lambda v: v >= 1, "must be >= 1"),
            ("data.max_len", lambda v: v <= d.row_len, f"must not exceed {flag('data.row_len')}"),
            (
                "data.tokens_per_batch",
                lambda v: v >= d.row_len,
                f"must be >= {flag('data.row_len')}",
            ),
            ("data.synthetic_num_train", lambda v: v >= 1, "must be >= 1"),
            ("data.synthetic_num_dev", lambda v: v >= 1, "must be >= 1"),
            ("data.synthetic_num_test", lambda v: v >= 1, "must be >= 1"),
            ("data.src_subword_alpha", lambda v: 0.0 <= v < 1.0, "must be in [0, 1) (0 = off)"),
            ("data.tgt_subword_alpha", lambda v: 0.0 <= v < 1.0, "must be in [0, 1) (0 = off)"),
            *self._corpora_rules(),
        ]

    def _corpora_rules(self) -> list[Rule]:
        """The rules of data.train_corpora, each naming the entry it is about."""
        d = self.data
        field = "data.train_corpora"
        rules: list[Rule] = [
            (
                field,
                lambda v: not v or d.source in ("files", "tfds"),
                "applies to --config.data.source=files or tfds",
            ),
        ]
        seen: dict[tuple[str, str], int] = {}
        tags: dict[str, int] = {}
        for i, c in enumerate(d.train_corpora):
            named = f"corpus {i + 1}"
            if not isinstance(c, TrainCorpus) or not all(
                isinstance(x, str) for x in (c.prefix, c.tfds_split, c.tag)
            ):
                return [*rules, (field, lambda v: False, f"{named}: must be a TrainCorpus of str")]
            key = ("prefix", c.prefix) if c.prefix else ("tfds_split", c.tfds_split)
            first, first_tag = seen.setdefault(key, i), tags.setdefault(c.tag, i)
            rules += [
                (
                    field,
                    lambda v, i=i: bool(v[i].prefix) != bool(v[i].tfds_split),
                    f"{named}: give one of prefix and tfds_split",
                ),
                (
                    field,
                    lambda v, i=i: is_positive_number(v[i].weight),
                    f"{named}: weight must be a finite number > 0, not {c.weight!r}",
                ),
                (
                    field,
                    lambda v, i=i: not any(ch.isspace() for ch in v[i].tag),
                    f"{named}: tag {c.tag!r} must be one piece, without spaces",
                ),
                (
                    field,
                    lambda v, ok=first == i: ok,
                    f"{named}: {key[0]} {key[1]!r} is corpus {first + 1} already",
                ),
                (
                    field,
                    lambda v, ok=not c.tag or first_tag == i: ok,
                    f"{named}: tag {c.tag!r} is corpus {first_tag + 1}'s already",
                ),
            ]
        # Each tag takes a piece of the vocabulary, beside the four special ones.
        num_tags = len(set(tags) - {""})
        rules.append(
            (
                "data.vocab_size",
                lambda v: v >= 5 + num_tags,
                f"must be >= 5 + the {num_tags} tags of data.train_corpora",
            )
        )
        return rules

    def _train_rules(self) -> list[Rule]:
        """The training run's rules; some depend on the batch's shape."""
        d, t = self.data, self.train
        flag = self._flag
        return [
            ("train.num_train_steps", lambda v: v >= 1, "must be >= 1"),
            ("train.warmup_steps", lambda v: v >= 1, "must be >= 1"),
            ("train.learning_rate_scale", lambda v: v > 0.0, "must be > 0"),
            # A decay to 0 needs steps after the warm-up to fall over.
            (
                "train.warmup_steps",
                lambda v: t.lr_decay == "rsqrt" or v < t.num_train_steps,
                f"must be below {flag('train.num_train_steps')} when {flag('train.lr_decay')}",
            ),
            # Adam divides by (1 - beta^t) and by sqrt(v) + eps (Sec. 5.3).
            ("train.adam_beta1", lambda v: 0.0 <= v < 1.0, "must be in [0, 1)"),
            ("train.adam_beta2", lambda v: 0.0 <= v < 1.0, "must be in [0, 1)"),
            ("train.adam_eps", lambda v: v > 0.0, "must be > 0"),
            ("train.weight_decay", lambda v: 0.0 <= v < 1.0, "must be in [0, 1) (0 = off)"),
            ("train.label_smoothing", lambda v: 0.0 <= v < 1.0, "must be in [0, 1)"),
            ("train.ema_decay", lambda v: 0.0 <= v < 1.0, "must be in [0, 1) (0 = off)"),
            ("train.grad_accum_steps", lambda v: v >= 1, "must be >= 1"),
            # Each micro-batch needs a row (and on several devices a row per device).
            (
                "train.grad_accum_steps",
                lambda v: v <= d.tokens_per_batch // d.row_len,
                "must not exceed the rows of a batch, "
                f"{flag('data.tokens_per_batch')} // {flag('data.row_len')}",
            ),
            # NumPy's generators take no negative seed, JAX's key no seed beyond 64 bits.
            ("train.seed", lambda v: 0 <= v < 2**63, "must be in [0, 2**63)"),
            ("train.steps_per_call", lambda v: v >= 1, "must be >= 1"),
            ("train.log_every_steps", lambda v: v >= 1, "must be >= 1"),
            ("train.checkpoint_every_steps", lambda v: v >= 1, "must be >= 1"),
            # Orbax keeps this many and deletes the rest: 0 would keep no checkpoint at all.
            ("train.keep_checkpoints", lambda v: v >= 1, "must be >= 1"),
            ("train.max_consecutive_skips", lambda v: v >= 1, "must be >= 1"),
            ("train.stop_check_every_steps", lambda v: v >= 1, "must be >= 1"),
            ("train.eval_every_steps", lambda v: v >= 1, "must be >= 1"),
            (
                "train.init_from",
                lambda v: v == "" or split_init_from(v)[0] != "",
                'must be WORKDIR or WORKDIR@STEP ("" = off)',
            ),
            (
                "train.early_stopping_patience",
                lambda v: v >= 0,
                "must be >= 0 (0 = off)",
            ),
            # A language model is scored by its dev loss alone: it has no BLEU to keep or wait for.
            (
                "train.keep_best_by",
                lambda v: v == "" or d.source != "monolingual",
                f"needs dev BLEU, which a language model ({flag('data.source')}) has not",
            ),
            (
                "train.early_stopping_patience",
                lambda v: v == 0 or d.source != "monolingual",
                f"needs dev BLEU, which a language model ({flag('data.source')}) has not",
            ),
            (
                "train.profile_steps",
                lambda v: v == "" or split_profile_steps(v) is not None,
                'must be A:B with 1 <= A <= B ("" = off)',
            ),
        ]

    def _decode_rules(self) -> list[Rule]:
        """The search's rules, and those between averaging and the checkpoints kept."""
        t = self.train
        flag = self._flag
        return [
            *((f"decode.{name}", ok, rule) for name, (ok, rule) in SEARCH_RULES.items()),
            ("decode.eval_num_sentences", lambda v: v >= 0, "must be >= 0 (0 = whole dev set)"),
            ("decode.average_last", lambda v: v >= 1, "must be >= 1 (1 = the last step alone)"),
            (
                "decode.alignment_layer",
                lambda v: v == -1 or 0 <= v < self.model.num_layers,
                f"must be -1 or a decoder layer, 0 to {flag('model.num_layers')} - 1",
            ),
            # Orbax deletes all but the newest keep_checkpoints: the older ones are gone by the
            # time the final evaluation would average them.
            (
                "train.keep_checkpoints",
                lambda v: v >= self.decode.average_last,
                f"must be >= {flag('decode.average_last')}, the checkpoints averaged at the end",
            ),
            # Several steps a call act only between calls: each interval ends on a call's end.
            *(
                (
                    name,
                    lambda v: v % max(t.steps_per_call, 1) == 0,
                    f"must be a multiple of {flag('train.steps_per_call')}",
                )
                for name in (
                    "train.log_every_steps",
                    "train.checkpoint_every_steps",
                    "train.eval_every_steps",
                    "train.stop_check_every_steps",
                )
            ),
            # Steps checkpoint_every_steps apart and the last one are saved.
            (
                "decode.average_last",
                lambda v: v <= -(-t.num_train_steps // t.checkpoint_every_steps),
                f"must not exceed the {-(-t.num_train_steps // max(t.checkpoint_every_steps, 1))} "
                f"checkpoints that {flag('train.num_train_steps')} saves at "
                f"{flag('train.checkpoint_every_steps')}",
            ),
        ]

    def to_dict(self) -> dict[str, Any]:
        """The config as JSON writes it and reads it back: a tuple field (data.train_corpora)
        as a list, so that a config compares equal to its saved copy."""
        values = dataclasses.asdict(self)
        for fields in values.values():
            for name, value in fields.items():
                if isinstance(value, tuple):
                    fields[name] = list(value)
        return values


def split_init_from(text: str) -> tuple[str, int | None]:
    """`train.init_from` as (workdir, step), step None for the newest: "runs/a@4000" or "runs/a".

    Only a trailing "@" and digits name a step, so a path may hold "@" itself.
    """
    path, at, step = text.rpartition("@")
    if at and step.isdigit():
        return path, int(step)
    return text, None


def split_profile_steps(text: str) -> tuple[int, int] | None:
    """`train.profile_steps` "A:B" as (A, B), or None unless 1 <= A <= B."""
    first, colon, last = text.partition(":")
    if not (colon and first.strip().isdigit() and last.strip().isdigit()):
        return None
    first, last = int(first), int(last)
    return (first, last) if 1 <= first <= last else None


def unknown_field(config: Config) -> str | None:
    """What is wrong when a config holds an attribute that is not one of its fields, or None.

    A dataclass takes any attribute, so a misspelt name in a config file would be ignored.
    """
    sections = [f.name for f in dataclasses.fields(config)]
    for name in vars(config):
        if name not in sections:
            return f"config.{name} is not a section of the config{_did_you_mean(name, sections)}"
    for field in dataclasses.fields(config):
        section, values = field.name, getattr(config, field.name)
        kind = type(getattr(Config(), section))
        if not isinstance(values, kind):
            return (
                f"config.{section} is a {type(values).__name__}, not a {kind.__name__}: set its "
                f"fields one by one (config.{section}.name = value)"
            )
        names = [f.name for f in dataclasses.fields(values)]
        for name in vars(values):
            if name not in names:
                return (
                    f"config.{section}.{name} is not a field of config.{section}"
                    f"{_did_you_mean(name, names)}"
                )
    return None


def is_positive_number(value: Any) -> bool:
    """Whether `value` is an int or float (not a bool), finite and > 0."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and math.isfinite(value) and value > 0


def _did_you_mean(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=1)
    return f" (did you mean {close[0]}?)" if close else f"; its fields are {', '.join(names)}"


def _has_type(value: Any, kind: Any) -> bool:
    """Whether a field of type `kind` may hold `value` (an int may stand for a float)."""
    if isinstance(value, bool):
        return kind is bool
    if typing.get_origin(kind) is tuple:  # tuple[Item, ...]: a config file may give a list
        item = typing.get_args(kind)[0]
        return isinstance(value, (tuple, list)) and all(isinstance(v, item) for v in value)
    if choices(kind):
        return isinstance(value, str)
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def type_name(kind: Any) -> str:
    """The name a message gives a field's type: a choice's values are strings."""
    if typing.get_origin(kind) is tuple:
        return f"a tuple of {typing.get_args(kind)[0].__name__}"
    return "str" if choices(kind) else kind.__name__


def parse_value(text: str, kind: Any, flag: str) -> Any:
    if choices(kind):
        return text  # the choice itself is checked by validate, naming its values
    if typing.get_origin(kind) is tuple:
        return parse_dataclasses(text, typing.get_args(kind)[0], flag)
    try:
        if kind is bool:
            lowered = text.lower()
            if lowered not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return lowered in ("true", "1")
        if kind is int:
            if "e" not in text.lower():
                return int(text)
            # "1e3" is a thousand; "1e999" (infinite) and "1.5e0" name no int.
            number = float(text)
            if not number.is_integer():
                raise ValueError(text)
            return int(number)
        if kind is float:
            return float(text)
        if kind is str:
            return text
    except ValueError:
        pass
    raise ValueError(f"{flag}: cannot parse {text!r} as {kind.__name__}")


def parse_dataclasses(text: str, item: type, flag: str) -> tuple:
    """A JSON list of objects as a tuple of the dataclass `item`, each key one of its fields.

    The values' types and ranges are `Config.validate`'s to check, naming the entry.
    """
    names = [f.name for f in dataclasses.fields(item)]
    form = f"a JSON list of objects with keys {', '.join(names)}"
    try:
        values = json.loads(text)
    except ValueError:
        raise ValueError(f"{flag}: cannot parse {text!r} as {form}") from None
    if not isinstance(values, list) or not all(isinstance(v, dict) for v in values):
        raise ValueError(f"{flag}: cannot parse {text!r} as {form}")
    for value in values:
        for key in value:
            if key not in names:
                raise ValueError(f"{flag}: {key!r} is not a key of {form}")
    return tuple(item(**value) for value in values)


def apply_override(config: Config, dotted: str, text: str) -> None:
    """Sets `config.<section>.<field>` from its command-line text, checking name and type."""
    kind = config_field_type(dotted)
    section, name = dotted.split(".")
    setattr(getattr(config, section), name, parse_value(text, kind, f"--config.{dotted}"))


def packaged_configs_dir() -> pathlib.Path:
    """The example configs: `translate/configs/` once installed, `configs/` in a checkout.

    pyproject.toml installs the checkout's top-level `configs/` as the package
    `translate.configs`; an editable install and a plain checkout read it where it is.
    """
    package = pathlib.Path(__file__).parent
    installed = package / "configs"
    return installed if installed.is_dir() else package.parent / "configs"


def packaged_config_names() -> list[str]:
    return sorted(p.stem for p in packaged_configs_dir().glob("*.py") if p.stem != "__init__")


def find_config(name_or_path: str | pathlib.Path) -> pathlib.Path:
    """A config file by path (`configs/base.py`), or an example config by name (`base`).

    Raises FileNotFoundError naming --config and the example configs when neither exists.
    """
    path = pathlib.Path(name_or_path)
    if path.is_file():
        return path
    text = str(name_or_path)
    if text and path.name == text and not path.suffix:
        packaged = packaged_configs_dir() / f"{text}.py"
        if packaged.is_file():
            return packaged
    raise FileNotFoundError(
        f"--config={text}: no config file at {path}, and no example config of that name "
        f"(examples: {', '.join(packaged_config_names())})"
    )


def load_config(path: str | pathlib.Path, overrides: dict[str, str] | None = None) -> Config:
    """Loads `get_config()` from a Python config file and applies dotted overrides.

    Args:
      path: a config file, or the name of an example config (`base`, `multi30k`, ...).
      overrides: `section.field -> text`, as `--config.section.field=text` flags give them.
    """
    path = find_config(path)
    if path.resolve() in _LOADING:  # get_config() loads its own file
        raise ValueError(f"--config={path}: loads itself, without end")
    _LOADING.add(path.resolve())
    try:
        return _load_config_file(path, overrides)
    finally:
        _LOADING.discard(path.resolve())


# The config files being loaded now (one builds on another through load_config).
_LOADING: set[pathlib.Path] = set()


def _load_config_file(path: pathlib.Path, overrides: dict[str, str] | None) -> Config:
    spec = importlib.util.spec_from_file_location(f"_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    with _errors_named_by_line(path):
        try:
            spec.loader.exec_module(module)
        except ValueError as e:  # NUL bytes or not UTF-8, raised reading it: not Python
            innermost = traceback.extract_tb(e.__traceback__)[-1].filename
            if pathlib.Path(innermost).resolve() == path.resolve():
                raise  # the file's own code raised it: named by line below
            raise ValueError(f"--config={path}: not a Python file ({e})") from None
        if not hasattr(module, "get_config"):
            raise ValueError(f"--config: {path} defines no get_config()")
        required = [
            p.name
            for p in inspect.signature(module.get_config).parameters.values()
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        if required:
            raise ValueError(
                f"--config={path}: get_config() must take no arguments (it needs "
                f"{', '.join(required)}); change a field with --config.section.field=value"
            )
        config = module.get_config()
    if not isinstance(config, Config):
        raise ValueError(f"--config: get_config() in {path} must return translate.config.Config")
    if unknown := unknown_field(config):
        raise ValueError(f"--config={path}: {unknown}")
    for dotted, text in (overrides or {}).items():
        apply_override(config, dotted, text)
    return config.validate()


@contextlib.contextmanager
def _errors_named_by_line(path: pathlib.Path):
    """Turns an error raised by a config file's own code into one naming the file and line.

    A syntax error, or any exception whose innermost frame in `path` is the user's own code
    (a NameError, a bad import), becomes `ValueError("--config=PATH:LINE: ...")`; an error
    raised inside this package while the file runs keeps its traceback.
    """
    try:
        yield
    except RecursionError:
        raise ValueError(f"--config={path}: loads itself, without end") from None
    except SystemExit as e:  # sys.exit() in the file: otherwise a command that did nothing
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == str(path)]
        where = f"{path}:{lines[-1]}" if lines else str(path)
        raise ValueError(
            f"--config={where}: the config file exits (sys.exit({e.code!r})) while it is read; a "
            "config file defines get_config() and leaves the exiting to the command"
        ) from None
    except SyntaxError as e:
        if e.filename is None:  # raised before a line was read: NUL bytes, say
            raise ValueError(f"--config={path}: not a Python file ({e.msg})") from None
        if pathlib.Path(e.filename).resolve() != path.resolve():
            raise
        raise ValueError(
            f"--config={path}:{e.lineno}: {e.msg} ({(e.text or '').strip()})"
        ) from None
    except Exception as e:
        frames = traceback.extract_tb(e.__traceback__)
        if not frames or pathlib.Path(frames[-1].filename).resolve() != path.resolve():
            raise
        hint = ""
        if isinstance(e, ModuleNotFoundError) and "configs" in str(e):
            hint = (
                "; to build on a shipped config, call translate.config.load_config('tiny') "
                "(a name or a path) in get_config() and change what you need"
            )
        raise ValueError(
            f"--config={path}:{frames[-1].lineno}: {type(e).__name__}: {e}{hint}"
        ) from None


def config_from_dict(values: dict[str, Any]) -> Config:
    """Rebuilds a Config from `to_dict()` output (e.g. the copy saved in a workdir)."""
    config = Config()
    for section, fields in values.items():
        for name, value in fields.items():
            # Strings as they are: JSON's quoting would double every backslash (C:\\data).
            text = value if isinstance(value, str) else json.dumps(value)
            apply_override(config, f"{section}.{name}", text)
    return config


def field_descriptions(section: type) -> dict[str, str]:
    """Each field's description: the `#` comment above it in this file, its one source.

    A comment describes the field below it and the fields right after that have none of their
    own (`adam_beta1`, `adam_beta2`, `adam_eps` share "Adam hyper-parameters"); a comment at
    the end of a field's line describes that field alone. Read with `tokenize`, so a string
    that holds `#` or `:` is never taken for a comment or a field.
    """
    source = textwrap.dedent(inspect.getsource(section))
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    body = next(t.end[1] for t in tokens if t.type == tokenize.INDENT)
    descriptions: dict[str, str] = {}
    comment: list[str] = []  # the comment lines above the next field
    shared, last_field, last_row = "", "", -2
    for i, token in enumerate(tokens):
        at_body = token.start[1] == body
        text = token.string.lstrip("#").strip()
        if token.type == tokenize.COMMENT and token.line.lstrip().startswith("#"):
            if at_body:
                comment.append(text)
        elif token.type == tokenize.COMMENT and token.start[0] == last_row:
            descriptions[last_field] = text
        elif at_body and token.type == tokenize.OP and token.string == "@":
            break
        elif at_body and token.type == tokenize.NAME:
            if token.string in ("def", "class"):
                break
            if tokens[i + 1].string != ":":
                continue
            if comment:
                shared, comment = " ".join(comment), []
            elif token.start[0] != last_row + 1:
                shared = ""
            descriptions[token.string] = shared
            last_field, last_row = token.string, token.start[0]
    return descriptions


def config_field_type(dotted: str) -> Any:
    """The type of `Config.<section>.<field>`; ValueError naming the flag when there is none."""
    flag = f"--config.{dotted}"
    parts = dotted.split(".")
    sections = {f.name: f.type for f in dataclasses.fields(Config)}
    if len(parts) != 2 or parts[0] not in sections:
        raise ValueError(f"{flag}: unknown config section; sections are {sorted(sections)}")
    hints = typing.get_type_hints(typing.get_type_hints(Config)[parts[0]])
    if parts[1] not in hints:
        raise ValueError(
            f"{flag}: unknown field {parts[1]!r} of config.{parts[0]}; fields are {sorted(hints)}"
        )
    return hints[parts[1]]


# The sections of a Config, in the order --help lists them.
CONFIG_SECTIONS = ("model", "data", "train", "decode")
