"""Secure aggregation by pairwise additive masking (Bonawitz et al., CCS 2017).

Every pair of clients (i, j) agrees on a secret by Diffie-Hellman over the
process group: each client draws a private exponent a_i, publishes
A_i = g^a_i mod p (RFC 3526 group 14, 2048 bits), and computes
s_ij = H(A_j^a_i mod p) = H(A_i^a_j mod p). Only public keys cross the wire, so
no third party (and no worker other than the two clients' hosts) knows s_ij.

In round t, client i sends its update, encoded in fixed point in Z_M (M = 2^48),
plus the pairwise masks

    y_i = x_i + sum_{j in R, j > i} PRG(s_ij, t) - sum_{j in R, j < i} PRG(s_ij, t)   (mod M)

where R is the set of clients that reported this round. Summed over R the masks
cancel exactly (integer arithmetic mod M), so the sum equals sum_i x_i while
every single y_i looks uniformly random. PRG is SHAKE-256, a cryptographic
extendable-output function.

Dropouts: R is agreed on (a vector of report flags, no update data) before
anything is masked, so a client that failed or timed out is simply not in R and
no mask is left unmatched: the masking step of the round is redone over the
survivors, without retraining them. What this does not protect against: a
malicious (not merely curious) peer, since public keys are not authenticated.
"""

from __future__ import annotations

import hashlib
import secrets

import numpy as np
import torch

# RFC 3526, 2048-bit MODP group (group 14); generator 2
MODP_2048 = int(
    "FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A0879"
    "8E3404DDEF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B"
    "0BFF5CB6F406B7EDEE386BFB5A899FA5AE9F24117C4B1FE649286651ECE45B3DC2007CB8A163BF0598DA4836"
    "1C55D39A69163FA8FD24CF5F83655D23DCA3AD961C62F356208552BB9ED529077096966D670C354E4ABC9804"
    "F1746C08CA18217C32905E462E36CE3BE39E772C180E86039B2783A2EC07A28FB5C55DF06F4C52C9DE2BCBF6"
    "955817183995497CEA956AE515D2261898FA051015728E5A8AACAA68FFFFFFFFFFFFFFFF",
    16,
)
GENERATOR = 2
KEY_BYTES = 256
MODULUS_BITS = 48
MODULUS = 1 << MODULUS_BITS
FRACTION_BITS = 24
#: a sum whose magnitude reaches this cannot be told apart from a negative one
RANGE_LIMIT = float(1 << (MODULUS_BITS - 1))


class KeyPair:
    """A client's Diffie-Hellman key pair; the private part never leaves this object."""

    def __init__(self) -> None:
        self._private = secrets.randbits(256) | (1 << 255)
        self.public = pow(GENERATOR, self._private, MODP_2048)

    def public_bytes(self) -> bytes:
        return self.public.to_bytes(KEY_BYTES, "big")

    def shared_seed(self, their_public: bytes) -> bytes:
        """H(their_public ^ private mod p): the same on both sides of the pair."""
        value = int.from_bytes(their_public, "big")
        if not 1 < value < MODP_2048 - 1:
            raise ValueError("invalid Diffie-Hellman public key")
        secret = pow(value, self._private, MODP_2048)
        return hashlib.sha256(secret.to_bytes(KEY_BYTES, "big")).digest()


def pair_mask(seed: bytes, rnd: int, size: int) -> torch.Tensor:
    """PRG(s_ij, t): `size` uniform integers in [0, M) from SHAKE-256(seed || round)."""
    stream = hashlib.shake_256(seed + rnd.to_bytes(8, "big")).digest(8 * size)
    words = np.frombuffer(stream, dtype="<u8") & np.uint64(MODULUS - 1)
    return torch.from_numpy(words.astype(np.int64))


def encode(vector: torch.Tensor) -> torch.Tensor:
    """Fixed point with FRACTION_BITS fractional bits, as residues in [0, M)."""
    scaled = torch.round(vector.double() * (1 << FRACTION_BITS)).to(torch.int64)
    return torch.remainder(scaled, MODULUS)


def decode(total: torch.Tensor) -> torch.Tensor:
    """The signed value of a sum of encodings (mod M), back to float64."""
    residue = torch.remainder(total, MODULUS)
    signed = torch.where(residue >= MODULUS // 2, residue - MODULUS, residue)
    return signed.double() / (1 << FRACTION_BITS)


def fixed_point_magnitude(vector: torch.Tensor) -> float:
    """The largest |value| of `vector` in fixed-point units (for the range check)."""
    return float(vector.abs().max()) * (1 << FRACTION_BITS) if vector.numel() else 0.0


def mask(
    client: int, encoded: torch.Tensor, seeds: dict[int, bytes], reported: list[int], rnd: int
) -> torch.Tensor:
    """y_i: client `client`'s encoded update plus its masks with every other reporter."""
    out = encoded.clone()
    for peer in reported:
        if peer == client:
            continue
        noise = pair_mask(seeds[peer], rnd, encoded.numel())
        if client < peer:
            out += noise
        else:
            out -= noise
        out.remainder_(MODULUS)
    return out
