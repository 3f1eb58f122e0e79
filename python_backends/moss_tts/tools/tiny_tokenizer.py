"""A small byte-level BPE tokenizer laid out like Qwen's, for tiny test checkpoints.

Special tokens sit at Qwen3's real ids (151643 `<|endoftext|>` ... 151670), so prompt rows
built with it carry the same special ids as the real model. Ids below 151643 that the tiny
merges do not reach are filler entries that never appear in an encoding. The names of
151669/151670 are not published; `<|audio_start|>`/`<|audio_end|>` are our guess.
"""

from __future__ import annotations

from pathlib import Path

# Qwen2/Qwen3 split pattern: contractions, letters, single digits, punctuation runs, spaces.
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
FIRST_SPECIAL_ID = 151643
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|audio_start|>", "<|audio_end|>",
]
CORPUS = [
    "user\n", "assistant\n", "<user_inst>\n- Reference(s):\n", "\n</user_inst>", "None",
    "\n- Instruction:\n", "\n- Tokens:\n", "\n- Quality:\n", "\n- Sound Event:\n",
    "\n- Ambient Sound:\n", "\n- Language:\n", "\n- Text:\n", "English", "Chinese", "French",
    "Hello world, this is a tiny text to speech test. The quick brown fox jumps over the lazy dog.",
    "Speak slowly and warmly. [pause 1.5s] Then continue with a brighter voice.",
    "你好，欢迎使用语音合成服务。今天天气很好。", "ni3 hao3 shi4 jie4", "ˈhɛloʊ wɜːld",
    "Bonjour tout le monde, ceci est un test.", "0123456789 percent, dollars and seconds.",
]


def build_tokenizer(vocab_target: int = 1000):
    """Train the tiny BPE and place Qwen's special tokens at their real ids."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    def fresh(model):
        tok = Tokenizer(model)
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        tok.decoder = decoders.ByteLevel()
        return tok

    trained = fresh(models.BPE())
    trainer = trainers.BpeTrainer(vocab_size=vocab_target, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    trained.train_from_iterator(CORPUS * 4, trainer=trainer)
    state = trained.model
    vocab = dict(trained.get_vocab())
    filler = len(vocab)
    while len(vocab) < FIRST_SPECIAL_ID:
        vocab[f"<|tiny_unused_{filler}|>"] = len(vocab)
        filler += 1
    merges = _merges(trained)
    del state
    tok = fresh(models.BPE(vocab=vocab, merges=merges))
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok


def _merges(tok) -> list[tuple[str, str]]:
    import json

    data = json.loads(tok.to_str())["model"]["merges"]
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in data]


def save_tokenizer(directory: Path) -> None:
    """Write tokenizer.json + tokenizer_config.json loadable by transformers' AutoTokenizer."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(), eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", model_max_length=32768)
    fast.save_pretrained(str(directory))
