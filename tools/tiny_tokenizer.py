"""Tiny byte-level BPE tokenizers for the random-weight fixtures (used by make_fixtures.py).

Each family gets the pre-tokenizer split regex, normalizer, special tokens and a chat template
shaped like the real model family, but a vocabulary trained (with the `tokenizers` package) on
the small built-in corpus below, so tokenizer.json stays a few tens of KB:

  llama    Llama 3 regex (digits in groups of 1-3), BOS <|begin_of_text|> added by the
           post-processor, Llama 3 header/eot chat format
  qwen2    Qwen2 regex (single digits), NFC, no BOS, ChatML
  qwen3    as qwen2, plus <think> </think> (added, not special); template honours enable_thinking
  qwen3_5  Qwen3.5 regex (\\p{M} joins letters), NFC, ChatML, <think> </think>

Special tokens come after the trained vocabulary (as in the real models). For the Qwen families
the model's vocab_size is larger than the tokenizer (padded, as in real Qwen checkpoints).
"""
from __future__ import annotations

import json
from pathlib import Path

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# A small training corpus written for this project: English prose, a little code and numbers.
CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog did not seem to mind at all.",
    "A small model can still tell us whether the arithmetic of a large one is right.",
    "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is Madrid.",
    "We measure the time it takes to read every weight once, because that is the limit for decoding.",
    "When the cache is warm, the next token costs one pass over the weights and a little attention.",
    "Speculative decoding guesses several tokens and checks them together; the checks are cheap on a GPU.",
    "In 2024 there were 365 days, 8784 hours, and 527040 minutes, give or take a leap second.",
    "She said: \"It's late, isn't it?\" and he answered 'We'll see; they've done it before.'",
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(i, add(i, i * 2))\n",
    "fn main() {\n    let xs: Vec<u32> = (0..16).collect();\n    println!(\"{}\", xs.len());\n}\n",
    "Tokens, logits, and probabilities: the model maps a sequence of ids to a score for every id.",
    "Le café est très bon. Naïve façade, résumé, coöperate: accents and marks matter here.",
    "Hello, world! Hello again, world. How are you today? I am fine, thank you very much.",
    "   Indented text\twith tabs\tand  double  spaces\n\nand blank lines\n\n\nend.",
    "user\nassistant\nsystem\nYou are a helpful assistant. Answer briefly and clearly.",
]

REFERENCE_TEXT = "The quick brown fox jumps over the lazy dog. The capital of France is Paris."

LLAMA_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CHATML_THINK_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

FAMILIES = {
    "llama": dict(regex=LLAMA3_RE, nfc=False, bos="<|begin_of_text|>", eos="<|end_of_text|>", pad=None,
                  special=["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                           "<|eot_id|>"],
                  plain_added=[], stops=["<|end_of_text|>", "<|eot_id|>"], template=LLAMA_TEMPLATE,
                  config_bos="<|begin_of_text|>", config_eos="<|end_of_text|>", pad_model_vocab=False),
    "qwen2": dict(regex=QWEN2_RE, nfc=True, bos=None, eos="<|im_end|>", pad="<|endoftext|>",
                  special=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], plain_added=[],
                  stops=["<|im_end|>", "<|endoftext|>"], template=CHATML_TEMPLATE,
                  config_bos="<|endoftext|>", config_eos="<|im_end|>", pad_model_vocab=True),
    "qwen3": dict(regex=QWEN2_RE, nfc=True, bos=None, eos="<|im_end|>", pad="<|endoftext|>",
                  special=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], plain_added=["<think>", "</think>"],
                  stops=["<|im_end|>", "<|endoftext|>"], template=CHATML_THINK_TEMPLATE,
                  config_bos="<|endoftext|>", config_eos="<|im_end|>", pad_model_vocab=True),
    "qwen3_5": dict(regex=QWEN35_RE, nfc=True, bos=None, eos="<|im_end|>", pad="<|endoftext|>",
                    special=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], plain_added=["<think>", "</think>"],
                    stops=["<|im_end|>", "<|endoftext|>"], template=CHATML_THINK_TEMPLATE,
                    config_bos="<|endoftext|>", config_eos="<|endoftext|>", pad_model_vocab=True),
}


def build(family: str, vocab_size: int):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    f = FAMILIES[family]
    n_added = len(f["special"]) + len(f["plain_added"])
    # Qwen families: leave room so that the model's vocab_size is padded past the tokenizer.
    n_trained = vocab_size - n_added - (24 if f["pad_model_vocab"] else 0)
    tok = Tokenizer(models.BPE(byte_fallback=False, ignore_merges=False))
    if f["nfc"]:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(f["regex"]), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=n_trained, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(CORPUS, trainer)
    assert tok.get_vocab_size() == n_trained, (tok.get_vocab_size(), n_trained)
    from tokenizers import AddedToken
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in f["special"]])
    if f["plain_added"]:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in f["plain_added"]])
    if f["bos"]:
        bos_id = tok.token_to_id(f["bos"])
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{f['bos']}:0 $A:0", pair=f"{f['bos']}:0 $A:0 {f['bos']}:1 $B:1",
                                          special_tokens=[(f["bos"], bos_id)]),
        ])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def write(family: str, d: Path, vocab_size: int) -> dict:
    """Write tokenizer.json + tokenizer_config.json into d; return ids and the reference tokens."""
    f = FAMILIES[family]
    tok = build(family, vocab_size)
    tok.save(str(d / "tokenizer.json"))
    added = {}
    for t in f["special"] + f["plain_added"]:
        added[str(tok.token_to_id(t))] = {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": t in f["special"]}
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": f["bos"],
        "eos_token": f["eos"],
        "pad_token": f["pad"],
        "unk_token": None,
        "add_bos_token": f["bos"] is not None,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 256,
        "chat_template": f["template"],
    }
    with open(d / "tokenizer_config.json", "w") as fh:
        json.dump(cfg, fh, indent=2, ensure_ascii=False)
        fh.write("\n")

    # Reference sequence: 12 tokens. Llama: BOS + text; Qwen: <|im_start|> + text.
    if f["bos"]:
        ids = tok.encode(REFERENCE_TEXT).ids  # post-processor adds BOS
    else:
        ids = [tok.token_to_id("<|im_start|>")] + tok.encode(REFERENCE_TEXT).ids
    ids = ids[:12]
    assert len(ids) == 12
    return {
        "vocab_size": vocab_size if f["pad_model_vocab"] else tok.get_vocab_size(),
        "tokenizer_size": tok.get_vocab_size(),
        "bos_id": tok.token_to_id(f["config_bos"]),
        "eos_id": tok.token_to_id(f["config_eos"]),
        "pad_id": tok.token_to_id(f["pad"]) if f["pad"] else None,
        "stop_ids": [tok.token_to_id(t) for t in f["stops"]],
        "reference_tokens": ids,
        "reference_text": tok.decode(ids, skip_special_tokens=False),
    }
