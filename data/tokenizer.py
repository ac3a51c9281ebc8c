"""Tokenizers and their byte tables (the exact byte accounting of bits per byte).

Two kinds, one small interface (`Tokenizer`):
- `SentencePieceTokenizer`: a SentencePiece `.model` file (the official `sp1024` and friends).
- `ByteTokenizer` (`byte260`): ids 0..3 are pad/bos/eos/unk, id 4 + b is the raw byte b.

A token's bytes (docs/RULES.md, "Exact byte accounting"): 0 for control/unknown/unused pieces, 1 for a
byte-fallback piece, otherwise the UTF-8 length of the piece without its leading "▁", plus 1 when
the piece starts with "▁" and the previous token is not a boundary (control/unknown). `ByteTable`
holds the three lookup arrays that make this one vectorised expression.

`train_sentencepiece` trains a BPE tokenizer with the reference settings (byte fallback, nmt_nfkc,
split digits, no dummy prefix, ids pad/bos/eos/unk = 0/1/2/3, character coverage 0.999).
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from data.io import write_bytes_atomic

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
BYTE260_VOCAB_SIZE = 260
BYTE260_OFFSET = 4
SPACE_MARK = "\u2581"  # "▁", SentencePiece's whitespace marker


@dataclass(frozen=True)
class ByteTable:
    """Per-token byte lookup tables for one tokenizer (arrays of length vocab_size)."""

    base_bytes: np.ndarray  # int16: bytes the piece spells, without a leading "▁"
    has_leading_space: np.ndarray  # bool: the piece starts with "▁"
    is_boundary: np.ndarray  # bool: control/unknown/unused: no bytes, resets the leading space

    @property
    def vocab_size(self) -> int:
        return int(self.base_bytes.shape[0])

    def token_bytes(self, prev_ids: np.ndarray, target_ids: np.ndarray) -> np.ndarray:
        """Bytes of each target token given the token before it (same shapes; int64)."""
        out = self.base_bytes[target_ids].astype(np.int64)
        out += self.has_leading_space[target_ids] & ~self.is_boundary[prev_ids]
        return out

    source = "piece_table"
    """What `target_bytes` counts from (data/canonical.py: the documents' own counts are "canonical")."""

    def target_bytes(self, positions: np.ndarray, prev_ids: np.ndarray, target_ids: np.ndarray) -> np.ndarray:
        """`token_bytes`, with the targets' positions (unused: the table needs only the ids)."""
        del positions
        return self.token_bytes(prev_ids, target_ids)

    def count_bytes(self, ids: Sequence[int] | np.ndarray, prev_id: int = BOS_ID) -> int:
        """Total bytes spelled by `ids` when preceded by `prev_id` (a document after its BOS)."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return 0
        prev = np.concatenate([[prev_id], ids[:-1]])
        return int(self.token_bytes(prev, ids).sum())


class Tokenizer(Protocol):
    """What the data pipeline and the scorer need from a tokenizer."""

    kind: str
    vocab_size: int
    bos_id: int

    def encode(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def byte_table(self) -> ByteTable: ...


class SentencePieceTokenizer:
    """A SentencePiece model file."""

    kind = "sentencepiece"

    def __init__(self, model_path: str | os.PathLike[str]):
        import sentencepiece as spm

        self.path = Path(model_path)
        if not self.path.is_file():
            raise FileNotFoundError(f"tokenizer model not found: {self.path}")
        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(self.path))
        except (RuntimeError, OSError) as e:
            raise ValueError(f"{self.path} is not a SentencePiece model file ({e})") from e
        self.vocab_size = int(self.sp.vocab_size())
        self.bos_id = int(self.sp.bos_id())
        if self.bos_id < 0:
            raise ValueError(
                f"tokenizer {self.path} has no BOS piece; documents need one (train with bos_id=1)"
            )

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return self.sp.encode(list(texts), out_type=int)

    def decode(self, ids: Sequence[int]) -> str:
        return self.sp.decode([int(i) for i in ids])

    def byte_table(self) -> ByteTable:
        v = self.vocab_size
        base = np.zeros(v, dtype=np.int16)
        space = np.zeros(v, dtype=np.bool_)
        boundary = np.ones(v, dtype=np.bool_)
        for i in range(v):
            if self.sp.is_control(i) or self.sp.is_unknown(i) or self.sp.is_unused(i):
                continue
            boundary[i] = False
            if self.sp.is_byte(i):
                base[i] = 1
                continue
            piece = self.sp.id_to_piece(i)
            if piece.startswith(SPACE_MARK):
                space[i] = True
                piece = piece[len(SPACE_MARK) :]
            base[i] = len(piece.encode("utf-8"))
        return ByteTable(base, space, boundary)


class ByteTokenizer:
    """`byte260`: 4 specials then the 256 raw bytes; every document round-trips exactly."""

    kind = "byte260"
    vocab_size = BYTE260_VOCAB_SIZE
    bos_id = BOS_ID

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return [
            (np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int64) + BYTE260_OFFSET).tolist()
            for t in texts
        ]

    def decode(self, ids: Sequence[int]) -> str:
        arr = np.asarray([i for i in ids if i >= BYTE260_OFFSET], dtype=np.int64) - BYTE260_OFFSET
        return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def byte_table(self) -> ByteTable:
        base = np.zeros(self.vocab_size, dtype=np.int16)
        base[BYTE260_OFFSET:] = 1
        boundary = np.ones(self.vocab_size, dtype=np.bool_)
        boundary[BYTE260_OFFSET:] = False
        return ByteTable(base, np.zeros(self.vocab_size, dtype=np.bool_), boundary)


BYTE260_FILENAME = "byte260.json"


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """Load a tokenizer file: a SentencePiece `.model`, or `byte260.json` for the byte-level variant."""
    path = Path(path)
    if path.name == BYTE260_FILENAME:
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        return ByteTokenizer()
    if path.suffix != ".model":
        raise ValueError(
            f"unknown tokenizer file {path}: expected a SentencePiece .model or {BYTE260_FILENAME}"
        )
    return SentencePieceTokenizer(path)


def write_byte260(path: str | os.PathLike[str]) -> None:
    """The byte260 tokenizer's marker file (it has no parameters; the file names the kind). Written beside and
    renamed into place: a link planted at `path` is replaced, never written through."""
    write_bytes_atomic(path, b'{"kind": "byte260", "vocab_size": 260, "offset": 4}\n')


def pieces_in_text_order(model: bytes) -> bytes:
    """A SentencePiece model with its normal and user-defined pieces numbered in the order of their text (code
    points); control, unknown, unused and byte pieces keep their ids. Each piece keeps its score and type, so the
    text is cut and spelled as before: only the labels change.

    Why: the tokenizer does not count toward the cap, and an entry's own ids are free to carry information. Pieces
    of validation text numbered in the order the validation text uses them (each also found in the training text,
    so the count of pieces validation alone uses misses them) made 26 % of validation tokens the previous id + 1,
    and a model predicting that scored 0.70 bpb better than with the same pieces shuffled
    (tests/unit/data/test_attack_data.py). Numbered by their text, the ids say nothing the pieces do not."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]
    proto.ParseFromString(model)
    kind = sentencepiece_model_pb2.ModelProto.SentencePiece  # type: ignore[attr-defined]
    slots = [i for i, p in enumerate(proto.pieces) if p.type in (kind.NORMAL, kind.USER_DEFINED)]
    ordered = []
    for i in sorted(slots, key=lambda i: proto.pieces[i].piece):
        piece = kind()
        piece.CopyFrom(proto.pieces[i])
        ordered.append(piece)
    for i, piece in zip(slots, ordered, strict=True):
        proto.pieces[i].CopyFrom(piece)
    return proto.SerializeToString(deterministic=True)


SP1024_CHARSMAP_SHA256 = "79372c41389c2b9b29bc171017ab5400e352debd686b02670a42bec709015074"
"""sha256 of the official sp1024's (and sp8192's) normalisation table, `normalizer_spec.precompiled_charsmap`."""
NEWER_NMT_NFKC = ("\u061c", "\ua7f1")
"""What sentencepiece 0.2's built-in nmt_nfkc maps and the official table (an older one) leaves as it is: U+061C
(ARABIC LETTER MARK, to a space) and U+A7F1 with what follows it (to S and its accented forms). The canonical text
is the official table's: with the installed one a document holding either would not be what the official sp1024
(and the challenge's shards) make of it, and its bytes would depend on the installed sentencepiece."""


def _charsmap(normalizer: Any) -> bytes:
    """A SentencePiece normaliser's compiled table (`normalizer_spec.precompiled_charsmap`)."""
    from sentencepiece import sentencepiece_model_pb2

    spec = sentencepiece_model_pb2.NormalizerSpec()  # type: ignore[attr-defined]
    spec.ParseFromString(normalizer.serialized_normalizer_spec())
    return bytes(spec.precompiled_charsmap)


@functools.cache
def official_nmt_nfkc() -> Any:
    """A normaliser with the official sp1024's table, rebuilt from the installed built-in one less its newer rules
    and checked by its sha256 (ValueError, one line, for an installed sentencepiece whose table is neither)."""
    import hashlib

    import sentencepiece as spm

    built_in = spm.SentencePieceNormalizer(
        rule_name="nmt_nfkc", add_dummy_prefix=False, remove_extra_whitespaces=True, escape_whitespaces=True
    )
    if hashlib.sha256(_charsmap(built_in)).hexdigest() == SP1024_CHARSMAP_SHA256:
        return built_in
    rules = [(str(a), str(b)) for a, b in built_in.decompile() if not str(a).startswith(NEWER_NMT_NFKC)]
    spm.set_min_log_level(2)  # the builder's "Generated normalizer blob" is no news
    rebuilt = spm.SentencePieceNormalizer(
        norm_map=rules, add_dummy_prefix=False, remove_extra_whitespaces=True, escape_whitespaces=True
    )
    if hashlib.sha256(_charsmap(rebuilt)).hexdigest() != SP1024_CHARSMAP_SHA256:
        raise ValueError(
            f"sentencepiece {spm.__version__}: its built-in nmt_nfkc differs from the official sp1024's table in ways "
            "this harness does not know, so the canonical text would depend on it. HINT: install sentencepiece 0.2.x"
        )
    return rebuilt


def reproducible_model_bytes(model: bytes) -> bytes:
    """A trained model's bytes with the trainer spec's machine facts cleared: `num_threads` (the pieces and scores
    do not depend on it), so that two builds of the same documents give the same file; and its nmt_nfkc table the
    official one (`official_nmt_nfkc`), not the installed sentencepiece's, which may be newer: the canonical text
    is the official table's, and the tokenizer must give it back."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]
    proto.ParseFromString(model)
    proto.trainer_spec.ClearField("num_threads")
    if proto.normalizer_spec.name == "nmt_nfkc":
        proto.normalizer_spec.precompiled_charsmap = _charsmap(official_nmt_nfkc())
    return proto.SerializeToString(deterministic=True)


def train_sentencepiece(
    texts: Iterable[str],
    vocab_size: int,
    out_model: str | os.PathLike[str],
    *,
    num_threads: int | None = None,
    user_defined_symbols: Sequence[str] = (),
) -> Path:
    """Train a BPE SentencePiece model with the reference settings; returns the `.model` path.
    `user_defined_symbols`: pieces of their own (a declared transform's markers, data/proof.py)."""
    import sentencepiece as spm

    if vocab_size < BYTE260_OFFSET + 256 + 1:
        raise ValueError(f"--vocab-size must exceed 260 (4 specials + 256 byte pieces), got {vocab_size}")
    out_model = Path(out_model)
    out_model.parent.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=(t for t in texts if t),
        model_writer=model,  # no model_prefix: the trainer spec records no temporary path
        model_type="bpe",
        vocab_size=vocab_size,
        character_coverage=0.999,
        byte_fallback=True,
        split_digits=True,
        normalization_rule_name="nmt_nfkc",
        add_dummy_prefix=False,
        hard_vocab_limit=False,
        pad_id=PAD_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        unk_id=UNK_ID,
        max_sentence_length=1 << 20,
        num_threads=num_threads or os.cpu_count() or 1,
        minloglevel=2,
        user_defined_symbols=",".join(user_defined_symbols),
    )
    tmp = out_model.with_name(out_model.name + ".tmp")
    tmp.write_bytes(reproducible_model_bytes(model.getvalue()))
    os.replace(tmp, out_model)
    return out_model
