"""The built-in codecs' names and spec grammar, without the codecs (no torch): what `pgolf run` checks a
`pack.codec` value against before anything heavy loads. scoring/artifact/codecs/ builds the codecs these
names stand for, and a test holds the two to the same names."""

from __future__ import annotations

QUANTS = ("int5", "int6", "int7", "int8", "mixed")
INT_SCHEMES = {"int5": 5, "int6": 6, "int7": 7, "int8": 8}
SCHEMES = (*INT_SCHEMES, "fp16", "keep")
ROLES = ("embedding", "attention", "mlp", "other", "small")
ROLE_TABLE_DEFAULT = {
    "embedding": "int8",
    "attention": "int6",
    "mlp": "int5",
    "other": "int6",
    "small": "fp16",
}
SMALL_SCHEMES = ("fp16", "keep")
COMPRESSOR_NAMES = ("zlib9", "zstd22", "lzma9", "brotli11")
"""The keys of scoring/artifact/codecs/compress.py COMPRESSORS, in its order."""
REFERENCE_CODEC = "int8_zlib"

CODEC_GRAMMAR = (
    f"{{{'|'.join(QUANTS)}}}_{{{'|'.join(COMPRESSOR_NAMES)}}}[_shuffle], e.g. int6_zstd22 "
    f"(mixed_* may add a role table: mixed_brotli11:mlp=int5,attention=int6)"
)


def rowquant_names() -> list[str]:
    """Every built-in name of the per-row family (scoring/artifact/codecs/rowquant.py)."""
    return [f"{q}_{c}{s}" for q in QUANTS for c in COMPRESSOR_NAMES for s in ("", "_shuffle")]


BUILTIN_NAMES = frozenset((REFERENCE_CODEC, *rowquant_names()))


def parse_role_table(text: str, where: str = "codec spec") -> dict[str, str]:
    """`role=scheme,...` over ROLE_TABLE_DEFAULT; ValueError (one line) on an unknown role or scheme."""
    table = dict(ROLE_TABLE_DEFAULT)
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        role, eq, scheme = (x.strip() for x in item.partition("="))
        if not eq:
            raise ValueError(f"{where}: {item!r} is not ROLE=SCHEME (e.g. mlp=int5)")
        if role not in ROLES:
            raise ValueError(f"{where}: unknown role {role!r}; roles: {', '.join(ROLES)}")
        allowed = SMALL_SCHEMES if role == "small" else SCHEMES
        if scheme not in allowed:
            raise ValueError(f"{where}: {role}={scheme!r} is not a scheme; allowed: {', '.join(allowed)}")
        table[role] = scheme
    return table


def split_spec(spec: str) -> tuple[str, str, bool, str | None]:
    """(quant, compressor, shuffle, role table text or None) of `QUANT_COMPRESSOR[_shuffle][:TABLE]`;
    ValueError (one line, the grammar) when it is not one; a table only for mixed_*."""
    name, colon, args = spec.partition(":")
    parts = name.split("_")
    shuffle = parts[-1] == "shuffle"
    if shuffle:
        parts = parts[:-1]
    if len(parts) != 2 or parts[0] not in QUANTS or parts[1] not in COMPRESSOR_NAMES:
        raise ValueError(f"{spec!r} is not a codec; {CODEC_GRAMMAR}")
    if colon:
        if parts[0] != "mixed":
            raise ValueError(f"codec {name!r} takes no role table (only mixed_* codecs do): {spec!r}")
        parse_role_table(args, f"codec {spec!r}")
    return parts[0], parts[1], shuffle, args if colon else None


def check_codec_spec(spec: str) -> None:
    """ValueError (one line, the allowed forms) unless `spec` names a built-in codec or a valid mixed table."""
    if spec in BUILTIN_NAMES:
        return
    try:
        split_spec(spec)
    except ValueError as e:
        if ":" in spec and spec.partition(":")[0] in BUILTIN_NAMES:
            raise  # a known name with a bad table: the table's own message
        raise ValueError(f"{spec!r} is not a codec; {CODEC_GRAMMAR}") from e
