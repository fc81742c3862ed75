"""The local federation's SuperLink (federation.py): TLS with the run's own CA, and node
authentication that refuses a SuperNode whose key was not enrolled while an enrolled one
stays connected. No experiment runs: the nodes only connect."""

from __future__ import annotations

import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from paxlike.deploy.flower import federation, processes
from tests.deploy import flower_procs as fp


@pytest.fixture(scope='module')
def link(tmp_path_factory: pytest.TempPathFactory):
  """(the Federation, the enrolled node, the intruder's exit code) with every process stopped."""
  out = tmp_path_factory.mktemp('auth') / 'run'
  out.mkdir()
  began = fp.now_ticks()
  group = processes.Group(processes.flower_env(out / 'flwr_home'), out / 'logs')
  fed = federation.Federation(group, out, processes.free_port())
  try:
    fed.start_superlink(60)
    member = fed.start_node('member', fed.new_identity('member'), 'clients="0"')
    intruder = fed.start_node('intruder', fed.new_identity('intruder', enroll=False),
                              'clients="1"')
    try:
      code = intruder.wait(timeout=90)
    except subprocess.TimeoutExpired:
      code = None
    time.sleep(1)
    member_alive = member.poll() is None
    yield fed, member_alive, code
  finally:
    group.stop()
  assert fp.flower_processes_since(began) == []


def _handshake(port: int, context: ssl.SSLContext) -> str:
  with socket.create_connection(('127.0.0.1', port), timeout=10) as raw:
    with context.wrap_socket(raw, server_hostname='localhost') as tls:
      return tls.version()


def test_a_node_that_was_not_enrolled_is_refused_and_an_enrolled_one_stays(link):
  fed, member_alive, code = link
  assert code not in (None, 0), 'the intruder was not refused'
  log = (fed.group.logs / 'intruder.log').read_text()
  assert 'Failed to activate SuperNode' in log
  assert member_alive
  assert 'Failed to activate' not in (fed.group.logs / 'member.log').read_text()


def test_the_superlink_speaks_tls_with_a_certificate_of_the_runs_ca(link):
  fed, _, _ = link
  assert _handshake(fed.port, ssl.create_default_context(cafile=str(fed.tls.ca))).startswith('TLS')
  with pytest.raises(ssl.SSLCertVerificationError):  # The system's CAs do not vouch for it.
    _handshake(fed.port, ssl.create_default_context())
  assert Path(fed.tls.key).stat().st_mode & 0o077 == 0  # The private key is the owner's only.
