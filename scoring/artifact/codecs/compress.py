"""The last stage of the packing codecs: general-purpose compressors, each at one fixed level.

Compressors, each at one fixed level (the level is part of the name, so a name means one output):
    zlib9      zlib (deflate), level 9                       stdlib
    zstd22     Zstandard, level 22, no checksum, one thread   `zstandard`
    lzma9      xz container, preset 9                         stdlib
    brotli11   Brotli, quality 11, generic mode, lgwin 22     `brotli`

Decompression is bounded: output beyond MAX_DECODED_BYTES is refused (a decompression bomb stops
there, with PayloadError), and a truncated or corrupt stream is refused with PayloadError, never a
library's own exception or a hang.
"""

from __future__ import annotations

import io
import lzma
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import brotli  # type: ignore[import-untyped]
import zstandard

MAX_DECODED_BYTES = 1 << 30
"""The most bytes a payload may decompress to (1 GiB; a 16 MB artifact of int8 codes is far below)."""
_CHUNK = 1 << 20


class PayloadError(ValueError):
    """A codec payload is truncated, corrupt, or decompresses past MAX_DECODED_BYTES."""


def _too_big(name: str, limit: int) -> PayloadError:
    return PayloadError(
        f"{name} payload decompresses past {limit:,} bytes (a decompression bomb, or not a pgolf payload)"
    )


def _zlib_compress(data: bytes) -> bytes:
    return zlib.compress(data, level=9)


def _zlib_decompress(payload: bytes, limit: int) -> bytes:
    d = zlib.decompressobj()
    try:
        out = d.decompress(payload, limit + 1)
    except zlib.error as e:
        raise PayloadError(f"zlib9 payload is corrupt ({e})") from e
    if len(out) > limit:
        raise _too_big("zlib9", limit)
    if not d.eof:
        raise PayloadError("zlib9 payload is truncated (the stream does not end)")
    if d.unused_data:
        raise PayloadError(f"zlib9 payload has {len(d.unused_data)} bytes after the end of its stream")
    return out


def _zstd_compress(data: bytes) -> bytes:
    params = zstandard.ZstdCompressionParameters.from_level(22, write_checksum=False, threads=0)
    return zstandard.ZstdCompressor(compression_params=params).compress(data)


def _zstd_decompress(payload: bytes, limit: int) -> bytes:
    dctx = zstandard.ZstdDecompressor(max_window_size=1 << 27)
    out = bytearray()
    try:
        with dctx.stream_reader(io.BytesIO(payload), read_across_frames=False) as reader:
            while True:
                chunk = reader.read(_CHUNK)
                if not chunk:
                    break
                out += chunk
                if len(out) > limit:
                    raise _too_big("zstd22", limit)
    except zstandard.ZstdError as e:
        raise PayloadError(f"zstd22 payload is corrupt ({e})") from e
    if not out and payload:
        raise PayloadError("zstd22 payload is corrupt or truncated (it decompresses to nothing)")
    # A stream cut short reads as a shorter output without an error; the frame header's content size
    # (always written by compress()) catches it.
    try:
        size = zstandard.frame_content_size(payload)
    except zstandard.ZstdError as e:
        raise PayloadError(f"zstd22 payload has no valid frame header ({e})") from e
    if size != len(out):
        raise PayloadError(f"zstd22 payload is truncated: {len(out):,} of {size:,} bytes decompressed")
    return bytes(out)


def _lzma_compress(data: bytes) -> bytes:
    return lzma.compress(data, format=lzma.FORMAT_XZ, preset=9)


def _lzma_decompress(payload: bytes, limit: int) -> bytes:
    d = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    try:
        out = d.decompress(payload, max_length=limit + 1)
    except lzma.LZMAError as e:
        raise PayloadError(f"lzma9 payload is corrupt ({e})") from e
    if len(out) > limit:
        raise _too_big("lzma9", limit)
    if not d.eof:
        raise PayloadError("lzma9 payload is truncated (the stream does not end)")
    if d.unused_data:
        raise PayloadError(f"lzma9 payload has {len(d.unused_data)} bytes after the end of its stream")
    return out


def _brotli_compress(data: bytes) -> bytes:
    return bytes(brotli.compress(data, mode=brotli.MODE_GENERIC, quality=11, lgwin=22))


def _brotli_decompress(payload: bytes, limit: int) -> bytes:
    d = brotli.Decompressor()
    out = bytearray()
    try:
        out += d.process(payload, output_buffer_limit=_CHUNK)
        empty = 0
        while len(out) <= limit and not d.is_finished() and empty < 2:
            chunk = d.process(b"", output_buffer_limit=_CHUNK)  # drain: all input is already given
            empty = 0 if chunk else empty + 1
            out += chunk
    except brotli.error as e:
        raise PayloadError(f"brotli11 payload is corrupt ({e})") from e
    if len(out) > limit:
        raise _too_big("brotli11", limit)
    if not d.is_finished():
        raise PayloadError("brotli11 payload is truncated (the stream does not end)")
    return bytes(out)


@dataclass(frozen=True)
class Compressor:
    name: str
    compress: Callable[[bytes], bytes]
    _decompress: Callable[[bytes, int], bytes]

    def decompress(self, payload: bytes, limit: int | None = None) -> bytes:
        """The original bytes; PayloadError when corrupt, truncated, or over `limit` (MAX_DECODED_BYTES)."""
        return self._decompress(bytes(payload), MAX_DECODED_BYTES if limit is None else limit)


COMPRESSORS: dict[str, Compressor] = {
    c.name: c
    for c in (
        Compressor("zlib9", _zlib_compress, _zlib_decompress),
        Compressor("zstd22", _zstd_compress, _zstd_decompress),
        Compressor("lzma9", _lzma_compress, _lzma_decompress),
        Compressor("brotli11", _brotli_compress, _brotli_decompress),
    )
}
