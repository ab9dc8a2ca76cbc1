"""What `zoo bench` measures for each family, registered against the torch-free family spec
(registry/families.py, by its `kind`), so the exporter's Family object holds export alone.

A family's entry: `measure(context)` -> its figures; `summary(figures)` -> the ratios its
targets are stated in (BENCHMARKS.md); `profile(runtime, card, threads, folder)` -> the
per-operator times of the graphs its benchmark leans on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from export.bench.context import Context, Figure
from export.bench.decoder import bench_decoder, decoder_profile, decoder_summary
from export.bench.encoder import bench_encoder, encoder_summary, forward_profile
from export.bench.image import bench_image, image_profile, image_summary
from export.bench.seq2seq import bench_seq2seq, seq2seq_summary
from registry.catalog import Card
from registry.families import DECODER, ENCODER, ENCODER_DECODER, IMAGE, SEQUENCE, PerKind
from runtime.sessions import Runtime

Figures = dict[str, dict[str, Figure]]


@dataclass(frozen=True)
class FamilyBench:
    measure: Callable[[Context], Figures]
    summary: Callable[[Figures], dict[str, float]]
    profile: Callable[[Runtime, Card, int | None, Path], dict[str, dict[str, float]]]


ENCODER_BENCH = FamilyBench(bench_encoder, encoder_summary, forward_profile)
BENCHES: PerKind[FamilyBench] = PerKind("zoo bench", {
    ENCODER.kind: ENCODER_BENCH,
    SEQUENCE.kind: ENCODER_BENCH,  # a pooled decoder runs and is measured like an encoder
    DECODER.kind: FamilyBench(bench_decoder, decoder_summary, decoder_profile),
    ENCODER_DECODER.kind: FamilyBench(bench_seq2seq, seq2seq_summary,
                                      partial(forward_profile, file="encoder.onnx")),
    IMAGE.kind: FamilyBench(bench_image, image_summary, image_profile),  # a ViT
})
bench_of, register_bench = BENCHES.of, BENCHES.register
