"""Generation with a KV cache (`generate`, token ids in and out; `generate_text`, text in and out
through a tokenizer) and the pure sampling functions it uses.

`--mode=decode` (paxlike/cli/decode_text.py) calls `generate` on the job's restored params,
with the data's tokenizer and prompts cut to the model's context.
"""

from paxlike.decode.engine import (Decoder, Options, State, cache_len_for, decoder, generate,
                                   left_pad)
from paxlike.decode.sampling import Sampling, sample, top_k_filter, top_p_filter
from paxlike.decode.text import generate_text

__all__ = ['Decoder', 'Options', 'Sampling', 'State', 'cache_len_for', 'decoder', 'generate', 'generate_text',
           'left_pad', 'sample', 'top_k_filter', 'top_p_filter']
