"""Secure aggregation's extra bytes per client, to charge on the virtual clock (``privacy.secure_aggregation``).

SecAgg (Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning", CCS 2017,
its analysis of the client's communication) costs each of the n clients of one protocol instance

    B = 2n·a_K + (5n − 4)·a_S + m·R                                                  (SecAgg, client)

bits: its public keys and the n others' (a_K bits each), the encrypted secret shares it sends, receives and
reveals (a_S bits each), and its masked vector of m elements of R bits. The masks live in Z_{2^R}, which must
hold the sum of n inputs without wrapping: R = b + ⌈log2 n⌉ for b-bit inputs. So beyond the b-bit upload a client
sends anyway, secure aggregation adds

    ΔB = 2n·a_K + (5n − 4)·a_S + m·⌈log2 n⌉                                          (overhead)

With a_K = a_S = 256 bits and b = 16 this gives the paper's abstract's expansion over sending the data in the
clear: 1.73× for n = 2^10 clients and m = 2^20 elements, 1.98× for n = 2^14 and m = 2^24.

SecAgg+ (Bell, Bonawitz, Gascón, Lepoint and Raykova, "Secure Single-Server Aggregation with (Poly)Logarithmic
Overhead", CCS 2020) runs the same messages over a sparse random graph in which each client shares keys with k =
O(log n) neighbours, so its key and share terms are SecAgg's with the k + 1 clients of its neighbourhood in place
of n; the masked vector must still hold the sum of all n:

    ΔB⁺ = 2(k+1)·a_K + (5(k+1) − 4)·a_S + m·⌈log2 n⌉                                (overhead, SecAgg+)

rayfed's uploads are float32 (b = 32): m = the upload's bytes / 4.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["KEY_BITS", "SHARE_BITS", "overhead_bytes", "neighbourhood"]

KEY_BITS = 256
"""a_K: a public key's bits (an elliptic-curve Diffie-Hellman key, as the paper's 1.73× and 1.98× assume)."""
SHARE_BITS = 256
"""a_S: an encrypted secret share's bits (as the paper's figures assume)."""
ELEMENT_BYTES = 4
"""A float32 element of rayfed's uploads."""


def neighbourhood(protocol: str, clients: int, neighbours: int | None) -> int:
    """The clients one client exchanges keys and shares with, itself included: all n with SecAgg; with SecAgg+
    its k neighbours and itself, k = ``neighbours`` or ⌈log2 n⌉, at most n − 1."""
    if protocol == "secagg":
        return clients
    k = max(1, math.ceil(math.log2(clients))) if neighbours is None else neighbours
    return min(k, clients - 1) + 1


def overhead_bytes(
    protocol: str, clients: int, upload_bytes: np.ndarray | float, neighbours: int | None = None
) -> np.ndarray | float:
    """ΔB / 8 (module docstring): the bytes ``protocol`` (``secagg`` or ``secagg_plus``) adds to each upload of
    ``upload_bytes`` (float32 elements) in an instance of ``clients`` clients; 0 with ``off`` or a lone client."""
    if protocol == "off" or clients < 2:
        return 0.0 * upload_bytes
    d = neighbourhood(protocol, clients, neighbours)
    keys_and_shares = 2 * d * KEY_BITS + (5 * d - 4) * SHARE_BITS
    elements = np.asarray(upload_bytes, dtype=np.float64) / ELEMENT_BYTES
    wider = elements * math.ceil(math.log2(clients))
    bits = keys_and_shares + wider
    return float(np.ceil(bits / 8)) if np.ndim(bits) == 0 else np.ceil(bits / 8)
