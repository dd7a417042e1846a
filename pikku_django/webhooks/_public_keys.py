"""Loading public keys and checking signatures with them (the ``cryptography`` extra)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from pikku_django.webhooks.signatures import HEX, decode_base64, decode_hex

try:
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    HAS_CRYPTOGRAPHY = True
except ImportError:  # pragma: no cover - exercised only without the extra
    HAS_CRYPTOGRAPHY = False

# curve name, coordinate size in bytes, hash name
_ECDSA = {
    "ecdsa-p256-sha256": ("secp256r1", 32, "sha256"),
    "ecdsa-p384-sha384": ("secp384r1", 48, "sha384"),
    "ecdsa-p521-sha512": ("secp521r1", 66, "sha512"),
}


def require_cryptography(what: str) -> None:
    """Raise ImportError naming the extra when ``cryptography`` is not installed."""
    if not HAS_CRYPTOGRAPHY:
        raise ImportError(
            f"{what} needs the 'cryptography' package: pip install 'pikku-django[webhooks]'"
        )


@functools.lru_cache(maxsize=128)
def load_public_key(secret: str, algorithm: str) -> Any:
    """The public key in ``secret`` (PEM, certificate, base64/hex DER, raw Ed25519).

    Raises ``ValueError`` when it is not a public key of ``algorithm``'s type.
    """
    require_cryptography("public-key verification")
    try:
        key = _parse_public_key(secret.strip(), algorithm)
    except (ValueError, UnsupportedAlgorithm):
        raw_ok = ", or its 32 raw bytes in hex or base64" if algorithm == "ed25519" else ""
        raise ValueError(
            "not a public key: give it as PEM, a PEM certificate, or DER in hex or base64" + raw_ok
        ) from None
    if algorithm == "ed25519":
        if not isinstance(key, ed25519.Ed25519PublicKey):
            raise ValueError("not an Ed25519 public key")
    elif algorithm.startswith("rsa-"):
        if not isinstance(key, rsa.RSAPublicKey):
            raise ValueError("not an RSA public key")
    else:
        curve = _ECDSA[algorithm][0]
        if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != curve:
            raise ValueError(f"not an ECDSA {curve} public key")
    return key


def _parse_public_key(text: str, algorithm: str) -> Any:
    if text.startswith("-----BEGIN CERTIFICATE"):
        return x509.load_pem_x509_certificate(text.encode("ascii")).public_key()
    if text.startswith("-----BEGIN"):
        return serialization.load_pem_public_key(text.encode("ascii"))
    raw = decode_hex(text) if HEX.fullmatch(text) else decode_base64(text)
    if algorithm == "ed25519" and len(raw) == 32:
        return ed25519.Ed25519PublicKey.from_public_bytes(raw)
    return serialization.load_der_public_key(raw)


def _hash(name: str) -> hashes.HashAlgorithm:
    made: dict[str, Callable[[], hashes.HashAlgorithm]] = {
        "sha256": hashes.SHA256,
        "sha384": hashes.SHA384,
        "sha512": hashes.SHA512,
    }
    return made[name]()


def verify_public_key_signature(key: Any, algorithm: str, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` over ``message`` verifies under ``key``."""
    try:
        if algorithm == "ed25519":
            key.verify(signature, message)
        elif algorithm == "rsa-pkcs1v15-sha256":
            key.verify(signature, message, padding.PKCS1v15(), hashes.SHA256())
        elif algorithm == "rsa-pss-sha256":
            pss = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.AUTO)
            key.verify(signature, message, pss, hashes.SHA256())
        else:
            _, size, hash_name = _ECDSA[algorithm]
            scheme = ec.ECDSA(_hash(hash_name))
            candidates = [signature]
            if len(signature) == 2 * size:  # raw r || s
                r = int.from_bytes(signature[:size], "big")
                s = int.from_bytes(signature[size:], "big")
                candidates.append(encode_dss_signature(r, s))
            for candidate in candidates:
                try:
                    key.verify(candidate, message, scheme)
                    return True
                except (InvalidSignature, ValueError):
                    continue
            return False
    except (InvalidSignature, ValueError):
        return False
    return True
