"""The artifact: its format (PGOLFART), the byte cap, pack/unpack, and the codecs."""
