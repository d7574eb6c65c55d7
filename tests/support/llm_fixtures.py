"""A tiny random Llama with its own small byte-level BPE tokenizer, saved as a Hugging Face
folder: the `model='hf:<folder>'` path of tests, without downloading weights."""

from __future__ import annotations

from pathlib import Path


def write_tiny_llama(folder: Path, seed: int = 0) -> Path:
    """Writes config, random weights (~60k parameters) and a 1000-token tokenizer trained on the
    synthetic instruction set and the Alpaca template; returns the folder."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from adaptfl.workloads.instructions import alpaca_prompt
    from adaptfl.workloads.synthetic_instructions import synthetic_instructions

    texts = [alpaca_prompt(r["instruction"], r["input"]) + r["output"]
             for r in synthetic_instructions(400)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, tie_word_embeddings=False,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder
