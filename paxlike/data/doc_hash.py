"""A stable 64-bit hash of each document's text, computed for a whole chunk of documents in a
few numpy passes (the held-out split compares it with eval_fraction * 2**64).

For a text of code points c_0 .. c_{n-1} (Python's str; a lone surrogate is its own code point):

    s = sum(c_i * P**i) mod 2**64,   hash = fmix64(s ^ (n * M mod 2**64))

with fmix64 MurmurHash3's 64-bit finalizer, so every bit of s and n moves the top bits the split
reads. It depends on nothing but the text (no seed, no platform, no library version).

Why not hashlib: a call per document is Python work per document, a noticeable share of the
tokenizer's own encode (figures: docs/benchmarks.md, "The held-out hash"). Here a chunk is one
encode of its joined text (bytes when ASCII, else UTF-32), a multiply and a cumulative sum per
code point in windows of WINDOW code points (memory stays bounded however long a document is),
and a few operations per document.
"""

import functools

import numpy as np

P = 0x100000001B3  # The 64-bit FNV prime (odd, so invertible mod 2**64).
M = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: spreads the length.
MASK = (1 << 64) - 1
WINDOW = 1 << 18


def fmix64(h: np.ndarray) -> np.ndarray:
  """MurmurHash3's finalizer of uint64 `h` (elementwise)."""
  h = h ^ (h >> np.uint64(33))
  h = h * np.uint64(0xFF51AFD7ED558CCD)
  h = h ^ (h >> np.uint64(33))
  h = h * np.uint64(0xC4CEB9FE1A85EC53)
  return h ^ (h >> np.uint64(33))


@functools.lru_cache(maxsize=4)
def powers(base: int, n: int) -> np.ndarray:
  """uint64 [n + 1]: base**0 .. base**n mod 2**64 (cumprod wraps as the modulus does)."""
  out = np.full(n + 1, base, np.uint64)
  out[0] = 1
  return np.cumprod(out, dtype=np.uint64)


def code_points(text: str) -> np.ndarray:
  """`text`'s code points: uint8 for ASCII (a copy), else uint32 (its UTF-32)."""
  if text.isascii():
    return np.frombuffer(text.encode('ascii'), np.uint8)
  return np.frombuffer(text.encode('utf-32-le', 'surrogatepass'), '<u4')


def hashes(texts: list[str], window: int = WINDOW) -> np.ndarray:
  """uint64 [len(texts)]: each text's hash (see the module docstring).

  With G(x) = sum(c_i * P**i) over the chunk's code points before x, a text spanning [a, b) has
  s = (G(b) - G(a)) * P**-a. G is a cumulative sum per window of `window` code points, carried
  from window to window; G and P**-x are only kept at the texts' boundaries."""
  lengths = np.fromiter(map(len, texts), np.int64, len(texts))
  bounds = np.zeros(len(texts) + 1, np.int64)
  np.cumsum(lengths, out=bounds[1:])
  points = code_points(''.join(texts))
  pow_p, pow_inv = powers(P, window), powers(pow(P, -1, 1 << 64), window)
  windows = max(-(-len(points) // window), 1)
  owner = np.minimum(bounds // window, windows - 1)
  cut = np.searchsorted(owner, np.arange(windows + 1))  # Window w's bounds: cut[w]:cut[w + 1].
  g, inv = np.empty(len(bounds), np.uint64), np.empty(len(bounds), np.uint64)
  base, scale, unscale = 0, 1, 1  # G, P**a and P**-a at the window's start a, mod 2**64.
  local = np.empty(window + 1, np.uint64)
  local[0] = 0
  for w in range(windows):
    start = w * window
    piece = points[start:start + window]
    sums = local[1:len(piece) + 1]
    np.multiply(piece, pow_p[:len(piece)], out=sums)
    np.cumsum(sums, out=sums)
    at = slice(cut[w], cut[w + 1])
    offset = bounds[at] - start
    g[at] = np.uint64(base) + np.uint64(scale) * local[offset]
    inv[at] = np.uint64(unscale) * pow_inv[offset]
    base = (base + scale * int(local[len(piece)])) & MASK
    scale, unscale = (scale * int(pow_p[-1])) & MASK, (unscale * int(pow_inv[-1])) & MASK
  sums = (g[1:] - g[:-1]) * inv[:-1]
  return fmix64(sums ^ (lengths.astype(np.uint64) * np.uint64(M)))

