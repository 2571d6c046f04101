"""Google credentials that load like a user's and are never sent anywhere."""

from __future__ import annotations

import json
from pathlib import Path


def service_account_key(path: Path, project: str = "my-proj") -> Path:
    """Write a service-account key with a fresh RSA key (never sent anywhere)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": project,
                "private_key_id": "0" * 40,
                "private_key": pem,
                "client_email": f"llmft-deployer@{project}.iam.gserviceaccount.com",
                "client_id": "1" * 21,
                "token_uri": "https://oauth2.googleapis.com/token",
            }
        )
    )
    return path
