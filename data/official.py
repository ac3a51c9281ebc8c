"""The official tokenizer files, by their sha256 (no imports: the config and the tracks read this without numpy).

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
