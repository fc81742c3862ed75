"""The credentials of a local federation, made with `cryptography`: a CA, the SuperLink's TLS
certificate (for localhost and 127.0.0.1), and one EC key pair per SuperNode for Flower's node
authentication (the private key in OpenSSH format, which Flower requires; the public key in
OpenSSH format, which `flwr supernode register` reads)."""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

_DAYS = 30  # A local federation lives for one run; a month leaves room for clock skew.


@dataclasses.dataclass(frozen=True)
class Tls:
  """The files of the SuperLink's TLS: the CA every party trusts, its certificate and key."""

  ca: Path
  cert: Path
  key: Path


def _name(common_name: str) -> x509.Name:
  return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey,
               fmt: serialization.PrivateFormat) -> None:
  path.write_bytes(key.private_bytes(serialization.Encoding.PEM, fmt,
                                     serialization.NoEncryption()))
  path.chmod(0o600)


def make_tls(directory: Path) -> Tls:
  """A fresh CA and a server certificate it signs, valid for localhost and 127.0.0.1."""
  directory.mkdir(parents=True, exist_ok=True)
  now = datetime.datetime.now(datetime.timezone.utc)
  start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=_DAYS)
  ca_key = ec.generate_private_key(ec.SECP256R1())
  ca_name = _name('paxlike local federation CA')
  ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
             .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(start).not_valid_after(end)
             .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
             .sign(ca_key, hashes.SHA256()))
  key = ec.generate_private_key(ec.SECP256R1())
  names = x509.SubjectAlternativeName([x509.DNSName('localhost'),
                                       x509.IPAddress(ipaddress.ip_address('127.0.0.1'))])
  cert = (x509.CertificateBuilder().subject_name(_name('localhost')).issuer_name(ca_name)
          .public_key(key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(names, critical=False)
          .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
  tls = Tls(directory / 'ca.crt', directory / 'server.pem', directory / 'server.key')
  tls.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
  tls.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
  _write_key(tls.key, key, serialization.PrivateFormat.PKCS8)
  return tls


def make_node_key(directory: Path, name: str) -> tuple[Path, Path]:
  """(private key, public key) files of a new SuperNode identity `name`."""
  directory.mkdir(parents=True, exist_ok=True)
  key = ec.generate_private_key(ec.SECP256R1())
  private, public = directory / name, directory / f'{name}.pub'
  _write_key(private, key, serialization.PrivateFormat.OpenSSH)
  public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                   serialization.PublicFormat.OpenSSH) + b'\n')
  return private, public
