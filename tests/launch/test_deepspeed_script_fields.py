"""What of a study's model a DeepSpeed training script is told, and what the docs say it is not.

The ``deepspeed_gpt`` template passes the script the model's shape only; the other model fields
(GQA, SwiGLU, RMSNorm, RoPE, tied embeddings, biases, dropout, ...) are priced by the models but
reach no script, so the script must build them itself. A newcomer who ran the shipped workload
with a Llama-style model measured an MHA GELU model without a word: the frameworks guide now
names every field that is not passed, and this test holds that list to the code.
"""

from __future__ import annotations

import dataclasses
import re

from tests.docs_examples import REPO
from tuner.config.parallel import ParallelConfig
from tuner.launch.megatron_flags import deepspeed_script_flags
from tuner.spec.model import ModelSpec

GUIDE = REPO / "docs" / "guides" / "frameworks.md"
LEAD = "Only the shape above reaches the script."


def _not_passed() -> set[str]:
    """The model's fields no DeepSpeed script is given (a flag ``--a-b`` carries field ``a_b``);
    ``name`` is a label and ``moe`` has flags of its own."""
    model = ModelSpec(num_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
                      vocab_size=128, seq_length=32)  # fmt: skip
    config = ParallelConfig(micro_batch_size=1, global_batch_size=1)
    passed = {flag[0].lstrip("-").replace("-", "_") for flag in deepspeed_script_flags(
        model, config, train_iters=1)}  # fmt: skip
    fields = {f.name for f in dataclasses.fields(ModelSpec)} - {"name", "moe"}
    assert passed & fields, "no shape flag maps to a model field: the mapping broke"
    return fields - passed


def test_the_guide_names_every_model_field_a_deepspeed_script_is_not_given() -> None:
    text = " ".join(GUIDE.read_text().split())
    assert LEAD in text, f"{GUIDE.name}: the paragraph '{LEAD} ...' is gone"
    paragraph = text.split(LEAD, 1)[1].split(" yet ", 1)[0]
    named = set(re.findall(r"`([a-z_]+)`", paragraph))
    assert named == _not_passed(), (
        f"the guide names {sorted(named)}; the script is not given {sorted(_not_passed())}"
    )
