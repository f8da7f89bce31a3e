"""The real chat model: SmolLM2-135M-Instruct loads from its fetched GGUF and answers."""

import torch

from kvinspect.core.model.fetch import SMOLLM2, fetched_path


def test_smollm2_answers_paris(smollm2):
    tok, model = smollm2.tokenizer, smollm2.model
    assert smollm2.resolved.gguf_file == SMOLLM2.filename
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 30
    enc = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=20, do_sample=False)
    reply = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in reply, reply


def test_fetched_file_is_verified(smollm2):
    import hashlib

    p = fetched_path("smollm2")
    assert p.stat().st_size == SMOLLM2.size
    h = hashlib.sha256(p.read_bytes()).hexdigest()
    assert h == SMOLLM2.sha256
