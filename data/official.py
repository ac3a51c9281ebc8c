"""The official tokenizer files, by their sha256, and what a record track asks of any other tokenizer (no imports:
the config and the tracks read this without numpy).

`pgolf data build` keeps these files' piece ids as they are and numbers every other SentencePiece model's pieces in
the order of their text (data/tokenizer.py pieces_in_text_order); a record track knows the official splits' token
counts by them (scoring/tracks.py)."""

SP1024_SHA256 = "4f5e8adb109c66b4886963bc75a7befd73bda36d27fd7102df8e9e66503b0e2a"
SP8192_SHA256 = "4e979c92754cc9d7bdebd9dfe5edf3fc0b41b38714b394e4297fa851e3afd516"
OFFICIAL_TOKENIZERS = {SP1024_SHA256: "sp1024", SP8192_SHA256: "sp8192"}
"""sha256 of the official tokenizer files, by variant (byte260 is built in)."""

NEUTRAL_PIECE_ORDERS = ("trained here", "built in", "text")
"""How a dataset's tokenizer that is not an official file (whose own ids are "official") may number its pieces
(manifest `tokenizer.piece_order`, data/build.py piece_order) with no order of the entry's choosing: the trainer's
(learned here from training documents only), byte260's, or an entry's SentencePiece pieces numbered in the order
of their text. The one other order, "as given" (a file of another kind), a record track refuses."""

# A record track refuses more than scoring/tracks.py VAL_ONLY_PIECES_MAX pieces of VAL_ONLY_MIN_BYTES bytes or more
# that its validation split uses and its training split never does (data/proof.py val_only_pieces counts them).
VAL_ONLY_MIN_BYTES = 4
"""Pieces shorter than this (bytes, single characters) are left out: rare characters fall back to them honestly.

Why the count: the tokenizer does not count toward the cap: pieces of validation text (16 characters each) in
id order let a model that predicts id + 1 score 0.031 bpb on the documents they hold, and 64,512 of them fit in a
vocabulary of 65,536. A record track's training split is the official text, which no entrant writes, and the
official sp1024 and sp8192 use every piece on it; a piece the validation text alone uses is the tokenizer holding
that text. 64 of them can hold at most about 1,000 characters, some 1e-5 bpb of the split."""
