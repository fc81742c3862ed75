"""What a restore does when a committed checkpoint step is unreadable (`--restore_fallback`):
fail ('off'), use the newest readable step ('previous'; every step unreadable is still a
failure), or also allow starting again from step 0 when none is readable ('from_scratch').
Unreadable steps are moved aside, never deleted. Apart from checkpoint.py, so the CLI's flag
parser names the choices without importing Orbax."""

from typing import Literal

Fallback = Literal['off', 'previous', 'from_scratch']
FALLBACKS: tuple[Fallback, ...] = ('off', 'previous', 'from_scratch')
