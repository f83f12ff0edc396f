"""Text-model folders built in code, laid out as sentence-transformers and Hugging Face save them.

Three kinds around the demo encoder (hidden 128, 4 heads, 2 layers), each with the same
WordPiece ``tokenizer.json``:

- ``embed``: a sentence encoder: ``model.onnx`` (``last_hidden_state``), ``modules.json``
  (Transformer, Pooling, Normalize), ``1_Pooling/config.json`` (mean), ``sentence_bert_config.json``
  (``max_seq_length`` 128), ``config.json`` (``BertModel``);
- ``rerank``: a cross-encoder: one logit per (query, document) pair, ``config.json`` says
  ``BertForSequenceClassification`` with one label;
- ``classify``: a sequence classifier: three logits, ``id2label`` negative/neutral/positive.

``leak=True`` builds the encoder without the attention mask in its attention: padding then
changes every real token's vector, the fault a gate on padded batches must catch.

The tokenizer is a real WordPiece tokenizer made with the ``tokenizers`` library (BERT's
normalizer and pre-tokenizer, ``[CLS] A [SEP] B [SEP]`` with type ids, greedy longest-match
subwords); its vocabulary is written down here rather than trained, because the library's
trainer breaks ties between equally frequent merges differently from one process to the next
(two trainings on the same sentences gave different vocabularies), and a demo folder must be the
same bytes every time. Whole words come from ``WORDS``; single letters, digits and punctuation,
alone and as ``##`` continuations, spell any other ASCII word.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

from ortpilot.artifacts.atomic import atomic_write_text, save_model
from ortpilot.errors import UsageError
from ortpilot.models.encoder import make_encoder

TEXT_KINDS = ("embed", "rerank", "classify")
MAX_SEQ_LENGTH = 128
MAX_POSITIONS = 512
HIDDEN, HEADS, LAYERS, VOCAB = 128, 4, 2, 1000
CLASS_LABELS = ("negative", "neutral", "positive")
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
SUFFIXES = ("s", "es", "ed", "ing", "er", "est", "ly", "ion", "al", "ment", "ness", "able")
_WORD_LINES = (
    "the a an and or but if then so of to in on at by for with from into over under about after before",
    "between through during without within is are was were be been being have has had do does did will",
    "would can could should may might must not no yes all any each every some many more most few other",
    "such same own only just also very too here there where when why how what which who whom whose this",
    "that these those it its they them their we us our you your he him his she her i me my one two three",
    "four five six seven eight nine ten first second last next new old good bad great small large long",
    "short high low big little early late fast slow quick easy hard right left true false open close",
    "time day week month year night morning evening today tomorrow monday friday people person man woman",
    "child family friend world country city house home room door table chair water food bread egg salt",
    "flour sugar milk coffee tea recipe kitchen cook bake cat dog bird fish horse mat tree flower garden",
    "rain snow sun wind weather train station bus car road street map travel ticket hotel airport book",
    "page word sentence text language meaning question answer story report letter email message password",
    "account user name number price market money bank budget cost sale shop buy sell pay work job team",
    "office meeting project plan goal idea problem solution result test data model vector embedding search",
    "query document index rank score label class graph layer node edge attention network runtime onnx",
    "quantization speed memory cpu gpu server request batch token input output file folder code program",
    "python function value list error music song violin concert film game sport match player ball doctor",
    "patient dose health hospital school student teacher lesson science history art nature animal computer",
    "phone screen keyboard internet website news paper committee majority vote law government reset access",
    "help find make take give get see know think say tell ask use try run sit sleep hunt need want like",
    "love hate eat drink read write learn teach play watch move stop start keep turn show call",
    "sat ran went came saw made took gave found said told asked used tried",
)
WORDS = tuple(word for line in _WORD_LINES for word in line.split())


def _vocabulary() -> dict[str, int]:
    """Special tokens, whole words, suffixes, then characters alone and as continuations: ids in that order."""
    pieces = [*SPECIAL_TOKENS, *WORDS, *(f"##{s}" for s in SUFFIXES)]
    chars = string.ascii_lowercase + string.digits + string.punctuation
    pieces += [*chars, *(f"##{c}" for c in chars)]
    return {piece: i for i, piece in enumerate(dict.fromkeys(pieces))}


def make_text_tokenizer() -> Any:
    """The demo WordPiece ``tokenizers.Tokenizer`` (lower-casing, accents stripped, BERT's pair template)."""
    try:
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    except ImportError:
        raise UsageError("The demo text folders need the 'tokenizers' package: pip install tokenizers.") from None
    vocab = _vocabulary()
    if len(vocab) > VOCAB:
        raise ValueError(f"the demo vocabulary has {len(vocab)} pieces, more than the encoder's {VOCAB} rows")
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


def _config(kind: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        "model_type": "bert",
        "architectures": ["BertModel"],
        "hidden_size": HIDDEN,
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "max_position_embeddings": MAX_POSITIONS,
        "vocab_size": VOCAB,
        "pad_token_id": 0,
    }
    if kind != "embed":
        labels = ("LABEL_0",) if kind == "rerank" else CLASS_LABELS
        config["architectures"] = ["BertForSequenceClassification"]
        config["id2label"] = {str(i): name for i, name in enumerate(labels)}
        config["label2id"] = {name: i for i, name in enumerate(labels)}
    return config


def _json(path: Path, doc: Any) -> None:
    atomic_write_text(path, json.dumps(doc, indent=2) + "\n")


def text_folder(out_dir: str | Path, kind: str = "embed", *, leak: bool = False, seed: int = 0) -> Path:
    """Write a demo text-model folder of ``kind`` (``embed``, ``rerank``, ``classify``) into ``out_dir``
    (each file atomically) and return the folder. ``leak``: the encoder ignores its attention mask."""
    if kind not in TEXT_KINDS:
        raise UsageError(f"Unknown text folder kind '{kind}'. Valid kinds: {', '.join(TEXT_KINDS)}.")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = make_text_tokenizer()
    labels = {"embed": 0, "rerank": 1, "classify": len(CLASS_LABELS)}[kind]
    model = make_encoder(seed, LAYERS, HIDDEN, HEADS, VOCAB, MAX_POSITIONS, mask_attention=not leak, labels=labels)
    save_model(model, out / "model.onnx")
    atomic_write_text(out / "tokenizer.json", tokenizer.to_str(pretty=True))
    _json(
        out / "tokenizer_config.json",
        {"tokenizer_class": "BertTokenizerFast", "do_lower_case": True, "model_max_length": MAX_POSITIONS},
    )
    _json(out / "config.json", _config(kind))
    if kind == "embed":
        _json(out / "sentence_bert_config.json", {"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False})
        _json(
            out / "modules.json",
            [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
            ],
        )
        (out / "1_Pooling").mkdir(exist_ok=True)
        (out / "2_Normalize").mkdir(exist_ok=True)
        _json(
            out / "1_Pooling" / "config.json",
            {
                "word_embedding_dimension": HIDDEN,
                "pooling_mode_cls_token": False,
                "pooling_mode_mean_tokens": True,
                "pooling_mode_max_tokens": False,
                "pooling_mode_mean_sqrt_len_tokens": False,
                "pooling_mode_weightedmean_tokens": False,
                "pooling_mode_lasttoken": False,
                "include_prompt": True,
            },
        )
    return out


__all__ = ["CLASS_LABELS", "MAX_SEQ_LENGTH", "TEXT_KINDS", "WORDS", "make_text_tokenizer", "text_folder"]
