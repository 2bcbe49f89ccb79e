"""``transformers`` models for the benchmark (``--model hf-bert``, ``--model hf-llama``).

Real model code nobody here wrote, built from small configs (never downloaded), as
``se.from_torch`` users import it. ``HFLogits`` wraps one so that it looks like the
other twins of ``bench/torch_models.py``: ``forward(ids)`` returns logits that
``torch_models.loss_fn`` (mean softmax cross entropy) reads with the batch's labels:

* ``hf-bert``: ``BertForSequenceClassification``, logits ``[N, classes]``, labels
  ``[N, 1]`` (the defaults are BERT-tiny's shape: 2 layers, width 128, 2 heads,
  feed-forward 512, vocabulary 30522);
* ``hf-llama``: ``LlamaForCausalLM`` (grouped-query attention with half as many
  key/value heads, rotary embeddings, RMSNorm, SDPA), logits of every token
  ``[N * seq, vocab]``, labels ``[N, seq]`` (the next-token targets of synthetic
  text: any ids will do for timing); defaults: 2 layers, width 128, 4 heads,
  feed-forward 512, vocabulary 32000.

Dropout is off, so every mode computes the same numbers. The benchmark imports
``WithLoss(HFLogits(...))``, so the feeds are ``img`` (the token ids) and ``label``.
"""

import torch.nn as nn

__all__ = ["HFLogits", "build_hf"]


class HFLogits(nn.Module):
    """A ``transformers`` model called with ``input_ids``; its logits, tokens flattened
    for a causal LM."""

    def __init__(self, model, causal):
        super().__init__()
        self.model = model
        self.causal = causal

    def forward(self, ids):
        logits = self.model(input_ids=ids).logits
        return logits.flatten(0, 1) if self.causal else logits


def build_hf(name, d_model=128, heads=2, layers=2, classes=2, vocab=30522, seq_len=128):
    """The twin of benchmark model ``name`` (``hf-bert`` or ``hf-llama``)."""
    try:
        import transformers as T
    except ImportError:
        raise RuntimeError(f"--model {name} needs transformers (pip install transformers)") \
            from None
    T.logging.set_verbosity_error()
    if name == "hf-bert":
        config = T.BertConfig(vocab_size=vocab, hidden_size=d_model, num_hidden_layers=layers,
                              num_attention_heads=heads, intermediate_size=4 * d_model,
                              max_position_embeddings=max(512, seq_len), num_labels=classes,
                              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        return HFLogits(T.BertForSequenceClassification(config), causal=False)
    if name == "hf-llama":
        config = T.LlamaConfig(vocab_size=vocab, hidden_size=d_model, num_hidden_layers=layers,
                               num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                               intermediate_size=4 * d_model,
                               max_position_embeddings=max(256, seq_len), bos_token_id=0,
                               eos_token_id=0, pad_token_id=0)
        return HFLogits(T.LlamaForCausalLM(config), causal=True)
    raise ValueError(f"no transformers model {name!r}: use hf-bert or hf-llama")
