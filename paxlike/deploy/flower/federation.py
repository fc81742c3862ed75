"""The parties of a local federation over TLS with node authentication: a SuperLink that admits
only the SuperNodes whose public keys were enrolled, and SuperNodes that trust the run's CA.

The same flags make a real deployment (docs/flower.md): the SuperLink on one host with its
certificate, each SuperNode on its own host with the CA and its private key, each node's public
key enrolled with `flwr supernode register KEY.pub CONNECTION`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from paxlike.deploy.flower import certs, processes

CONNECTION = 'local'  # The name of the SuperLink's connection in FLWR_HOME's config.toml.


class Federation:
  """A SuperLink on 127.0.0.1:`port` with TLS and node authentication, in `group`; its
  credentials under `out`/credentials, `flwr`'s files under `out`/flwr_home."""

  def __init__(self, group: processes.Group, out: Path, port: int):
    self.group, self.out, self.port = group, out, port
    self.tls = certs.make_tls(out / 'credentials')
    self.home = out / 'flwr_home'
    processes.write_connection(self.home, CONNECTION, f'127.0.0.1:{port}', self.tls.ca)
    self.link: subprocess.Popen | None = None
    self.node_ids: dict[str, int] = {}  # The SuperLink's id of each node enrolled, by name.

  def start_superlink(self, timeout: float, attempts: int = 4) -> subprocess.Popen:
    """Starts the SuperLink and waits until it listens on its port; when another process took
    that port after it was chosen (or holds it beside the SuperLink), it stops the SuperLink and
    starts it again on another free port, up to `attempts` times in all (the connection in
    FLWR_HOME follows). RunFailure naming the ports when it never listens. Its state (runs,
    nodes, messages) is in memory: the launcher never restarts a SuperLink, so a file would
    only add SQLite's commits to every poll."""
    from paxlike.errors import RunFailure
    tls, tried = self.tls, []
    for attempt in range(attempts):
      if attempt:
        self.port = processes.free_port()
        processes.write_connection(self.home, CONNECTION, f'127.0.0.1:{self.port}', tls.ca)
      self.link = self.group.start('superlink' if not attempt else f'superlink{attempt}', [
          str(processes.BIN / 'flower-superlink'), '--ssl-ca-certfile', str(tls.ca),
          '--ssl-certfile', str(tls.cert), '--ssl-keyfile', str(tls.key),
          '--enable-supernode-auth', '--disable-runtime-dependency-installation',
          '--host', '127.0.0.1', '--port', str(self.port),
          '--database', ':flwr-in-memory:'])
      state = processes.wait_to_listen(self.port, timeout, self.link)
      if state == 'ours':
        return self.link
      tried.append(f'{self.port} ({state})')
      self.group.stop_one(self.link)
      if state == 'timeout':
        break
    raise RunFailure(f'the SuperLink did not listen on 127.0.0.1 port '
                     f'{", ".join(tried)}; "taken": another process listens there '
                     f'(logs in {self.group.logs})')

  def new_identity(self, name: str, enroll: bool = True) -> Path:
    """A new node key pair `name`; its public key enrolled at the SuperLink when `enroll` (its
    node id in `node_ids`). The private key's path (what the node is started with)."""
    from paxlike.errors import RunFailure
    private, public = certs.make_node_key(self.out / 'credentials' / 'nodes', name)
    if enroll:
      done = self.flwr('supernode', 'register', str(public), CONNECTION, '--format', 'json')
      try:
        self.node_ids[name] = int(json.loads(done.stdout)['node-id'])
      except (ValueError, KeyError, TypeError):
        raise RunFailure(f'enrolling node {name} failed: '
                         f'{(done.stdout + done.stderr).strip().splitlines()[-1:]}') from None
    return private

  def flwr(self, *args: str) -> subprocess.CompletedProcess:
    """The `flwr` CLI with this federation's FLWR_HOME (its connection `local`)."""
    return subprocess.run([str(processes.BIN / 'flwr'), *args], env=processes.flower_env(
        self.home), text=True, capture_output=True, timeout=120)

  def unregister(self, name: str) -> bool:
    """Removes enrolled node `name` from the federation: the SuperLink marks it offline at once
    (a message to it comes back as an error) and refuses its key from then on."""
    return self.flwr('supernode', 'unregister', str(self.node_ids[name]),
                     CONNECTION).returncode == 0

  def stop_run(self, run_id: int) -> bool:
    """Marks run `run_id` stopped at the SuperLink (`flwr stop`), which ends its log stream."""
    return self.flwr('stop', str(run_id), CONNECTION).returncode == 0

  def start_node(self, name: str, key: Path, node_config: str) -> subprocess.Popen:
    """A SuperNode `name` authenticating with private key `key`, on its own free port (Flower's,
    polling as often as a local federation can afford: paxlike.deploy.flower.supernode)."""
    return self.group.start(name, [
        sys.executable, '-m', 'paxlike.deploy.flower.supernode',
        '--root-certificates', str(self.tls.ca), '--auth-supernode-private-key', str(key),
        '--superlink', f'127.0.0.1:{self.port}',
        '--port', str(processes.free_port()), '--node-config', node_config])
