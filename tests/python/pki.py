"""Certificates, keys and token files for the trust tests and the TLS benchmark, made with the
real ``openssl`` and ``kilnd keygen`` in a folder of the caller's."""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

PathLike = Union[str, Path]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _ec_key_args(key: Path) -> list[str]:
    return ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key)]


def make_ca(folder: PathLike, name: str) -> tuple[Path, Path]:
    """A self-signed CA: (certificate, key)."""
    folder = Path(folder)
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    _openssl("req", "-x509", *_ec_key_args(key), "-days", "2", "-subj", f"/CN={name}", "-out", str(cert))
    return cert, key


def make_leaf(folder: PathLike, name: str, ca: tuple[Path, Path]) -> tuple[Path, Path]:
    """A certificate for localhost / 127.0.0.1, good for server and client auth, signed by
    ``ca``: (certificate, key). Each call makes a new key and serial."""
    folder = Path(folder)
    cert, key, csr, ext = (folder / f"{name}.crt", folder / f"{name}.key", folder / f"{name}.csr",
                           folder / f"{name}.ext")
    _openssl("req", "-new", *_ec_key_args(key), "-subj", f"/CN={name}", "-out", str(csr))
    ext.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                   "extendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-set_serial",
             str(secrets.randbits(63)), "-days", "2", "-extfile", str(ext), "-out", str(cert))
    return cert, key


def keygen(kilnd: PathLike, private_path: PathLike) -> tuple[Path, Path]:
    """``kilnd keygen``: (private key, public key)."""
    private_path = Path(private_path)
    subprocess.run([str(kilnd), "keygen", str(private_path)], check=True, capture_output=True, timeout=60)
    return private_path, Path(f"{private_path}.pub")


@dataclass
class Pki:
    """Everything a secure kilnd and its clients need."""

    folder: Path
    ca: tuple[Path, Path]
    server: tuple[Path, Path]
    client: tuple[Path, Path]
    other_ca: tuple[Path, Path]
    signing: tuple[Path, Path]
    other_signing: tuple[Path, Path]
    tokens_file: Path
    tokens: dict[str, str] = field(default_factory=dict)  # name -> token

    def server_args(self, mtls: bool = True, sign: bool = True) -> list[str]:
        args = ["--tls-cert", str(self.server[0]), "--tls-key", str(self.server[1]),
                "--auth-tokens", str(self.tokens_file)]
        if mtls:
            args += ["--tls-client-ca", str(self.ca[0])]
        if sign:
            args += ["--signing-key", str(self.signing[0])]
        return args

    def client_options(self, token: str = "", mtls: bool = True) -> dict:
        o: dict = {"tls_ca": self.ca[0]}
        if mtls:
            o.update(tls_cert=self.client[0], tls_key=self.client[1])
        if token:
            o["token"] = self.tokens[token]
        return o


def write_tokens(path: PathLike, tokens: dict[str, tuple[str, str]]) -> None:
    """``tokens``: name -> (role, token, [extra]) lines of a kilnd token file."""
    lines = ["# name role token [compiles=N]"]
    for name, spec in tokens.items():
        lines.append(" ".join([name, *spec]))
    Path(path).write_text("\n".join(lines) + "\n")


def make_pki(folder: PathLike, kilnd: PathLike) -> Pki:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ca = make_ca(folder, "kiln-test-ca")
    tokens = {name: f"{name}-{secrets.token_hex(16)}" for name in ("reader", "compiler", "admin", "limited")}
    tokens_file = folder / "tokens.txt"
    write_tokens(tokens_file, {
        "reader": ("read", tokens["reader"]),
        "compiler": ("compile", tokens["compiler"]),
        "admin": ("admin", tokens["admin"]),
        "limited": ("compile", tokens["limited"], "compiles=1"),
    })
    return Pki(
        folder=folder,
        ca=ca,
        server=make_leaf(folder, "server", ca),
        client=make_leaf(folder, "client", ca),
        other_ca=make_ca(folder, "other-ca"),
        signing=keygen(kilnd, folder / "signing.pem"),
        other_signing=keygen(kilnd, folder / "other-signing.pem"),
        tokens_file=tokens_file,
        tokens=tokens,
    )
