#!/usr/bin/env python3
"""Regenerates engine/data/testdata/bpe/: a small byte-level BPE tokenizer (vocab 600) trained on
engine/data/testdata/tiny_corpus.txt, the fixture of the tokenizer tests.

    tools/tokenize/python.sh tools/tokenize/make_test_tokenizer.py

tokenizer.json's post-processor adds <s> only; tokenizer_config.json says add_bos_token and
add_eos_token, so the tests can tell which of the two ithaca-tokenize followed.
"""
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
out = os.path.join(repo, "engine/data/testdata/bpe")
corpus = os.path.join(repo, "engine/data/testdata/tiny_corpus.txt")

tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<s>", "</s>"], show_progress=False,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train([corpus], trainer)
tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                   special_tokens=[("<s>", 0)])
os.makedirs(out, exist_ok=True)
tok.save(os.path.join(out, "tokenizer.json"))
with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
    json.dump({"add_bos_token": True, "add_eos_token": True, "bos_token": "<s>",
               "eos_token": "</s>"}, f, indent=2)
    f.write("\n")
print(f"{out}: vocab_size {tok.get_vocab_size()}")
