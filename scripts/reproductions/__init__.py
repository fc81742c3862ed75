"""Papers' headline results reproduced at small scale through paxlike's trainer.

`python scripts/reproduce.py NAME [--quick]` runs one (`--list` lists them). Each module here
is one reproduction: `NAME`, `TITLE` and `run(quick: bool, work: Path) -> page.Report`, which
trains through the CLI (reproductions.trainer), decides its verdict with a pure function of
the measured numbers, and leaves the page (reproductions.page) to the caller.
"""

NAMES = ('dp', 'fedavg', 'scaffold', 'fedopt', 'diloco', 'fedprox', 'papa', 'btm', 'dpo', 'grpo')
