#!/usr/bin/env python3
"""A tiny SentencePiece GGUF vocabulary and llama.cpp's tokenization of it
-> tests/fixtures/tokenizer/spm-tiny.gguf + spm-tiny.json.

No real SentencePiece-vocabulary model is obtainable here, so this trains a small BPE
SentencePiece model (byte fallback, no normalisation, `<think>` user-defined) on a built-in
corpus, writes its vocabulary as a vocab-only GGUF (tokenizer.ggml.model = "llama") with gguf-py,
and records llama.cpp's ids for a few strings (libllama via tools/llama_logits.py, vocab only),
cross-checked with sentencepiece's own encoder on the strings without special tokens.

    ~/.cache/kasoku/venv/bin/python tools/spm_fixture.py
"""
from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import gguf
import sentencepiece as spm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import llama_logits  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "tokenizer"
CORPUS = [
    "hello world, the quick brown fox jumps over the lazy dog.",
    "the world is full of words and worlds; hello again, world!",
    "tokenizers split text into pieces: words, subwords and bytes.",
    "def hello(name):\n    return 'hello ' + name\n",
    "numbers like 12, 345 and 6789 appear in the text too.",
    "sentencepiece writes spaces as a special underscore character.",
] * 20
TEXTS = [
    "hello world",
    "Hello World!",
    "the quick brown fox",
    "  two leading spaces and  double  spaces ",
    "def hello(name):\n    return name\n",
    "café 日本 🤖",
    "12345",
    "<s>hello</s> world",
    "<think>hmm</think> ok",
    "x<unk>y",
]


def main() -> None:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=model, model_type="bpe", vocab_size=400,
        byte_fallback=True, character_coverage=1.0, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=True, user_defined_symbols=["<think>", "</think>"],
        num_threads=1, bos_id=1, eos_id=2, unk_id=0, pad_id=-1, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())

    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(gguf.TokenType.UNKNOWN)
        elif sp.is_control(i):
            types.append(gguf.TokenType.CONTROL)
        elif sp.is_byte(i):
            types.append(gguf.TokenType.BYTE)
        elif sp.is_unused(i):
            types.append(gguf.TokenType.UNUSED)
        elif tokens[-1] in ("<think>", "</think>"):
            types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)

    path = OUT / "spm-tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    Llama = llama_logits._import_llama()
    llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
    cases = []
    for text in TEXTS:
        for special in ([True, False] if "<" in text else [True]):
            ids = llm.tokenize(text.encode(), add_bos=False, special=special)
            pieces = b"".join(llm.detokenize([t], special=True) for t in ids).decode("utf-8", "replace")
            case = {"text": text, "parse_special": special, "ids": ids, "pieces_concat": pieces}
            if "<" not in text:
                case["sentencepiece_ids"] = sp.encode(text)
                case["sentencepiece_decoded"] = sp.decode(ids)
            cases.append(case)
    result = {
        "gguf": path.name,
        "source": "llama.cpp tokenizer (llama_tokenize add_special=false); pieces_concat = llama_token_to_piece(special=true) "
                  f"of each id, concatenated; sentencepiece {spm.__version__} for the cross-check",
        "n_vocab": len(tokens),
        "cases": cases,
    }
    (OUT / "spm-tiny.json").write_text(json.dumps(result, ensure_ascii=False, indent=1) + "\n")
    bad = [c["text"] for c in cases if "sentencepiece_ids" in c and c["sentencepiece_ids"] != c["ids"]]
    print(f"{path}: {len(tokens)} tokens, {len(cases)} cases; sentencepiece disagrees on {bad}")


if __name__ == "__main__":
    main()
