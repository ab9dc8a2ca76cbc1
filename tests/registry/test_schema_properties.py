"""Property tests: whatever a card file holds, validation answers with a CardError or a valid
card, never a crash; and parameter arithmetic agrees with the modules for random small cards."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from registry import CardError
from registry.params import count_parameters
from registry.schema import FIELDS, validate
from tests.conftest import card, count_module_parameters
from zoo.assemble import build_model

ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6),
                      st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                      st.lists(st.integers(), max_size=2))


# No deadline: this asks whether validation crashes, not how fast; two workers share the cores.
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from([*FIELDS, "n_head", "extends"]), ANY_VALUE, max_size=12))
def test_validation_never_crashes(overrides: dict) -> None:
    fields = {**card("gpt-tiny").fields, **overrides}
    try:
        resolved = validate(fields, "random.yaml")
    except CardError as error:
        message = str(error)
        assert message.startswith(("random.yaml", "--set")) and "\n" not in message
        return
    assert resolved["d_model"] % resolved["n_heads"] == 0
    assert set(resolved) == set(FIELDS)


@settings(max_examples=25, deadline=None)
@given(
    family=st.sampled_from(["gpt-tiny", "bert-tiny", "transformer-tiny"]),
    heads=st.sampled_from([1, 2, 4]),
    layers=st.integers(1, 3),
    activation=st.sampled_from(["relu", "gelu", "gelu_tanh", "swiglu"]),
    norm=st.sampled_from(["layernorm", "rmsnorm"]),
    bias=st.booleans(),
    tie=st.booleans(),
)
def test_arithmetic_counts_equal_module_counts(family: str, heads: int, layers: int,
                                               activation: str, norm: str, bias: bool,
                                               tie: bool) -> None:
    resolved = card(family, n_heads=heads, n_layers=layers, activation=activation, norm=norm,
                    bias=bias, tie_embeddings=tie)
    model = build_model(resolved, meta=True)
    assert count_module_parameters(model) == sum(count_parameters(resolved.fields).values())
