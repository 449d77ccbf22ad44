"""Generate a tiny random-weight llama-architecture GGUF model for the real llama-server tier.

Nothing is downloaded: the tokenizer and the weights are synthesised here with the PyPI ``gguf``
package and numpy, from a fixed seed, so the same file (byte for byte) comes out on every run.

The model
---------
* architecture ``llama``; defaults: n_embd 64, 2 layers, 4 heads, n_ff 128, context_length 2048,
  every tensor F32 (~150k parameters, ~0.6 MB).
* SentencePiece-style ("llama") vocabulary: ``<unk>``, ``<s>``, ``</s>``, the 256 ``<0xXX>`` byte
  tokens, ``<|im_start|>``/``<|im_end|>``, single characters, and ``▁word`` pieces together with all of
  their prefixes (so the SPM merge loop can reach them: "hello world" is 2 tokens, not 11).
  A ChatML ``tokenizer.chat_template`` is embedded, so /v1/chat/completions works.
* It can never emit EOS, a control token or a byte token: residual dimension 0 is a constant +10
  (embeddings carry it, and no attention/FFN output writes to it) and the output rows of those tokens
  are -50 on it. Every request therefore runs exactly to ``n_predict``/``max_tokens``
  (``stop_type: "limit"``, ``finish_reason: "length"``); greedy output is reproducible word salad.

Usage::

    python tests/realserver/make_model.py OUT.gguf
    N_EMBD=1024 N_LAYER=8 N_FF=4096 python tests/realserver/make_model.py slow.gguf   # ~540 MB, slow to load
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

SEED = 20240601

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPACE = "\u2581"  # '▁', SentencePiece's word-boundary marker

CHARS = (
    [SPACE]
    + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    + [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    + [str(d) for d in range(10)]
    + list(".,!?'-:;()/\"")
)

WORDS = (
    "the of and to in is it you that he was for on are as with his they at be this have from or one "
    "had by word but not what all were we when your can said there use an each which she do how their "
    "if will up other about out many then them these so some her would make like him into time has look "
    "two more write go see number no way could people my than first water been call who oil its now find "
    "hello world gpu model server token slot health metric fleet heal node"
).split()

# token types (gguf.TokenType values; repeated here so the numbers are visible)
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6


def build_vocab() -> tuple[list[str], list[float], list[int]]:
    tokens: list[str] = ["<unk>", "<s>", "</s>"]
    types: list[int] = [UNKNOWN, CONTROL, CONTROL]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(BYTE)
    tokens += ["<|im_start|>", "<|im_end|>"]
    types += [CONTROL, CONTROL]
    seen = set(tokens)
    for ch in CHARS:
        tokens.append(ch)
        types.append(NORMAL)
        seen.add(ch)
    # "▁word" plus every prefix "▁w", "▁wo", ... so that SPM's bigram merges can build the word
    for word in WORDS:
        piece = SPACE + word
        for end in range(2, len(piece) + 1):
            p = piece[:end]
            if p not in seen:
                seen.add(p)
                tokens.append(p)
                types.append(NORMAL)
    # SPM merges prefer higher scores: longer pieces score higher; specials/bytes/chars score 0
    scores = [
        float(len(t)) if (ty == NORMAL and len(t) > 1) else 0.0
        for t, ty in zip(tokens, types, strict=True)
    ]
    return tokens, scores, types


def make_tiny_model(
    path: str | os.PathLike[str],
    *,
    n_embd: int = 64,
    n_layer: int = 2,
    n_ff: int = 128,
    n_head: int | None = None,
    n_ctx_train: int = 2048,
    seed: int = SEED,
) -> Path:
    """Write the model to ``path`` (parent directories are created) and return it as a Path."""
    import gguf  # imported here so that importing this module never needs gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if n_head is None:
        n_head = max(4, n_embd // 64)
    if n_embd % n_head:
        raise ValueError("n_embd must be divisible by n_head")
    head_dim = n_embd // n_head

    tokens, scores, types = build_vocab()
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def rand(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("gpuheal-tiny-random")
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    # numpy shapes are (out_features, in_features); gguf reverses them into ggml's ne order.
    emb = rand(n_vocab, n_embd, scale=1.0)
    emb[:, 0] = 10.0  # constant residual channel
    w.add_tensor("token_embd.weight", emb)

    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", rand(n_embd, n_embd, scale=n_embd**-0.5))
        w.add_tensor(p + "attn_k.weight", rand(n_embd, n_embd, scale=n_embd**-0.5))
        w.add_tensor(p + "attn_v.weight", rand(n_embd, n_embd, scale=n_embd**-0.5))
        wo = rand(n_embd, n_embd, scale=n_embd**-0.5)
        wo[0, :] = 0.0  # never write residual dim 0
        w.add_tensor(p + "attn_output.weight", wo)
        w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", rand(n_ff, n_embd, scale=n_embd**-0.5))
        w.add_tensor(p + "ffn_up.weight", rand(n_ff, n_embd, scale=n_embd**-0.5))
        down = rand(n_embd, n_ff, scale=n_ff**-0.5)
        down[0, :] = 0.0
        w.add_tensor(p + "ffn_down.weight", down)

    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    out = rand(n_vocab, n_embd, scale=1.0)
    out[:, 0] = 0.0
    # unk, bos, eos, the byte tokens and the ChatML markers can never win
    banned = [i for i, ty in enumerate(types) if ty != NORMAL]
    out[banned, 0] = -50.0
    w.add_tensor("output.weight", out)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} OUT.gguf  (env: N_EMBD, N_LAYER, N_FF, N_HEAD)", file=sys.stderr)
        return 2
    kw = {}
    for env, key in (
        ("N_EMBD", "n_embd"),
        ("N_LAYER", "n_layer"),
        ("N_FF", "n_ff"),
        ("N_HEAD", "n_head"),
    ):
        if os.environ.get(env):
            kw[key] = int(os.environ[env])
    out = make_tiny_model(argv[1], **kw)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
