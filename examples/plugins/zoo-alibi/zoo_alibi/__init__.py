"""The plugin's entry point (group `zoo.plugins`): torch-free, so `zoo list` and `zoo show`
answer without loading torch; the block's class is imported only when a model is built."""

from __future__ import annotations

from pathlib import Path

from registry.plugins import PluginAPI
from registry.schema import Field


def register(api: PluginAPI) -> None:
    api.add_block(
        "position", "alibi", "zoo_alibi.block:Alibi",
        param_count=lambda card: 0,  # slopes are fixed, a buffer: nothing is learned
        fields={"alibi_max_bias": Field(
            float, 8.0, "ALiBi: the head slopes are 2^(-alibi_max_bias * h / n_heads)",
            minimum=0.0, exclusive_minimum=True, maximum=64.0)},
    )
    api.add_cards(Path(__file__).parent / "cards")
