"""Chained hashes of full KV blocks, the keys of prefix caching (pure Python, no torch).

Block i's hash covers its parent's hash and its own token ids, so equal hashes mean equal
prefixes, not only equal blocks (vLLM's automatic prefix caching). The root folds in a
namespace (the model) and the request's `cache_salt`, so tenants with different salts never
share a block. BLAKE2b rather than Python's `hash()`: stable across processes, so another
process (the request scheduler) can compute the same keys from the same tokens.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

_DIGEST_BYTES = 8


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=_DIGEST_BYTES).digest(), "little")


def root_hash(namespace: str = "", cache_salt: str | None = None) -> int:
    """The parent of block 0: one per (model, salt); no salt and "" differ."""
    salt = "\x00" if cache_salt is None else "\x01" + cache_salt
    return _digest(f"bucketserve-prefix\x00{namespace}\x00{salt}".encode())


def hash_block(parent: int, token_ids: Sequence[int]) -> int:
    """The hash of one full block given its parent's hash."""
    return _digest(parent.to_bytes(_DIGEST_BYTES, "little") + array("q", token_ids).tobytes())


def extend_hashes(hashes: list[int], token_ids: Sequence[int], block_size: int, root: int,
                  num_blocks: int | None = None) -> list[int]:  # fmt: skip
    """Append to `hashes` (the chain of the first len(hashes) blocks) the hashes of the next
    full blocks of `token_ids`, up to `num_blocks` blocks in all (default: every full block)."""
    full = len(token_ids) // block_size
    end = full if num_blocks is None else min(num_blocks, full)
    for i in range(len(hashes), end):
        parent = hashes[-1] if hashes else root
        hashes.append(hash_block(parent, token_ids[i * block_size : (i + 1) * block_size]))
    return hashes


def block_hashes(token_ids: Sequence[int], block_size: int, namespace: str = "",
                 cache_salt: str | None = None) -> list[int]:  # fmt: skip
    """Chained hashes of every full block of `token_ids`."""
    return extend_hashes([], token_ids, block_size, root_hash(namespace, cache_salt))
